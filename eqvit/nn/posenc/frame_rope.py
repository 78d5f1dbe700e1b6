"""Frame RoPE (Platonic Transformer seed, Sec. 3.2): RoPE on the positions seen from each frame.

Queries and keys are regular features split into heads, laid out frames-major as
``[B, N, |G| * H, D]``. Frame R sees position p as ``R^-1 p``; head h rotates its ``D / 2``
adjacent channel pairs ``(x_2k, x_2k+1)`` by the angles ``omega_{h,k} . (R^-1 p)``. The
frequencies ``omega`` are shared by all frames, so the score of frame R depends on
``R^-1 (p_j - p_i)`` only: rotating the input by g in G and permuting the frames by
``R -> g^-1 R`` leaves every score in place (seed App. B).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from eqvit.geometry.points import fibonacci_sphere
from eqvit.groups import FiniteGroup
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.posenc.base import PositionalScheme


def default_frequencies(
    num_heads: int, head_dim: int, dim: int, min_wavelength: float, max_wavelength: float
) -> np.ndarray:
    """``[H, D/2, dim]`` frequency vectors: log-spaced magnitudes, directions spread over the sphere.

    Magnitudes ``2 pi / lambda`` with ``lambda`` geometric from ``max_wavelength`` to
    ``min_wavelength`` (the same in every head); directions from a golden-angle spiral (3-D) or
    the golden angle (2-D) over all ``H * D/2`` pairs, so heads look along different directions.
    """
    pairs = head_dim // 2
    wavelengths = np.geomspace(max_wavelength, min_wavelength, pairs)
    count = num_heads * pairs
    if dim == 3:
        directions = fibonacci_sphere(count)
    elif dim == 2:
        angle = np.arange(count) * math.pi * (3.0 - math.sqrt(5.0))
        directions = np.stack([np.cos(angle), np.sin(angle)], axis=-1)
    else:
        raise ValueError(f"frame RoPE needs 2-D or 3-D positions, got dim {dim}")
    magnitudes = np.tile(2 * math.pi / wavelengths, num_heads)
    return (magnitudes[:, None] * directions).reshape(num_heads, pairs, dim)


def rotate_pairs(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate the adjacent channel pairs ``(x_2k, x_2k+1)`` of ``x [..., D]`` by ``rotation [..., D/2, 2]``.

    ``rotation`` holds (cos, sin) per pair and broadcasts against ``x``'s leading dims. One complex
    multiply: the pairs and the table are viewed as complex numbers (no copies; ``x`` may be a
    strided view such as one of q, k, v split off a stacked projection). Reduced-precision inputs
    (bf16 / fp16 under autocast) are rotated in float32 and cast back.
    """
    dtype = x.dtype
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    pairs = torch.view_as_complex(x.to(work).unflatten(-1, (-1, 2)))
    turned = pairs * torch.view_as_complex(rotation.to(work))
    return torch.view_as_real(turned).flatten(-2).to(dtype)


def rotate_pairs_(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """:func:`rotate_pairs` in place; returns ``x``.

    A float32 / float64 ``x`` whose pairs can be viewed as complex numbers (even strides, such as
    q and k inside a stacked qkv output) is multiplied in place: no new tensor, and q, k, v keep
    sharing one storage. Other inputs (reduced precision) are rotated out of place and copied back.
    """
    complex_view = x.dtype in (torch.float32, torch.float64) and x.stride(-1) == 1
    if complex_view and all(s % 2 == 0 for s in x.stride()[:-1]):
        torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(torch.view_as_complex(rotation.to(x.dtype)))
        return x
    return x.copy_(rotate_pairs(x, rotation))


class FrameRoPE(ExactBuffers, PositionalScheme):
    """RoPE with positions seen from every frame of ``group``; frames act as extra heads.

    Args:
        group: the frames G (``[|G|, d, d]`` matrices, d = 2 or 3 = the position dimension).
        num_heads: heads per frame H.
        head_dim: channels per head D (even).
        positions: fixed token positions ``[N, d]`` (images, the sphere): angles precomputed as
            buffers. ``None`` for inputs whose positions change per sample (point clouds): use
            :meth:`bind`.
        learnable: learn the frequencies (initialised as :func:`default_frequencies`); the angles
            are then recomputed every forward.
        min_wavelength, max_wavelength: range of the frequencies, in position units.

    ``rotate_qk_tokens(q, k)`` takes ``q, k [B, N, |G| * H, D]`` (frames-major heads), or the same
    with the heads unflattened, ``[B, N, |G|, H, D]``.
    """

    is_rotary = True

    def __init__(
        self,
        group: FiniteGroup,
        num_heads: int,
        head_dim: int,
        positions: torch.Tensor | np.ndarray | None = None,
        learnable: bool = False,
        min_wavelength: float = 0.25,
        max_wavelength: float = 8.0,
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"frame RoPE rotates channel pairs: head_dim must be even, got {head_dim}")
        self.order, self.num_heads, self.head_dim = group.order, num_heads, head_dim
        self.rotary_split = (num_heads, head_dim)  # rotates in the frame basis
        self.in_type = self.out_type = FeatureType.frames(group, num_heads * head_dim)  # queries and keys
        self.dim = group.dim
        freqs = torch.from_numpy(default_frequencies(num_heads, head_dim, group.dim, min_wavelength, max_wavelength))
        self.register_exact_buffer("frames", torch.from_numpy(group.elements.copy()))
        if learnable:
            self.freqs = nn.Parameter(freqs.float())
        else:
            self.register_exact_buffer("freqs", freqs)
        self.learnable = learnable
        self.fixed_positions = positions is not None
        if positions is not None:
            # on the CPU whatever the ambient device (a meta-device build): exact float64 geometry
            positions = torch.as_tensor(np.asarray(positions), dtype=torch.float64, device="cpu")
            self._check_positions(positions)
            self.register_exact_buffer("positions", positions)
            if not learnable:  # everything is fixed: precompute the rotations once, (cos, sin) pairs
                cos, sin = self._cos_sin(positions, freqs, torch.from_numpy(group.elements.copy()))
                self.register_exact_buffer("rotation", torch.stack([cos, sin], dim=-1))

    def _check_positions(self, positions: torch.Tensor) -> None:
        if positions.ndim < 2 or positions.shape[-1] != self.dim:
            raise ValueError(f"expected positions [..., N, {self.dim}], got {list(positions.shape)}")

    @staticmethod
    def _cos_sin(
        positions: torch.Tensor, freqs: torch.Tensor, frames: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Angles ``omega_{h,k} . (R_g^T p_n)`` as cos/sin ``[..., N, G * H, D/2]``."""
        # Steer the frequencies instead of the positions (seed App. D): omega . R^T p = (R omega) . p.
        steered = torch.einsum("gij,hkj->ghki", frames, freqs)  # [G, H, D/2, d]
        angles = torch.einsum("...ni,ghki->...nghk", positions, steered).flatten(-3, -2)
        return angles.cos(), angles.sin()

    def cos_sin(self, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[N, G * H, D/2]`` (fixed positions) or ``[B, N, G * H, D/2]`` (given ``positions [B, N, d]``)."""
        if positions is None:
            if not self.fixed_positions:
                raise ValueError("this FrameRoPE has no fixed positions: pass positions [B, N, d] (see bind)")
            if not self.learnable:
                return self.rotation[..., 0], self.rotation[..., 1]
            positions = self.positions
        self._check_positions(positions)
        return self._cos_sin(positions.to(self.freqs.dtype), self.freqs, self.frames.to(self.freqs.dtype))

    def rope_for(self, *inputs: torch.Tensor) -> PositionalScheme:
        """Fixed positions: this scheme; otherwise bound to the positions ``inputs[0] [B, N, d]``."""
        return self if self.fixed_positions else self.bind(inputs[0])

    def bind(self, positions: torch.Tensor) -> BoundFrameRoPE:
        """The rotary scheme for per-sample positions ``[B, N, d]`` (computed once per forward)."""
        return BoundFrameRoPE(*self.cos_sin(positions))

    def rotate_qk_tokens(
        self, q: torch.Tensor, k: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _rotate_tokens(q, k, self.rotation_table(), num_prefix_tokens)

    def rotate_qk_stacked_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        return _rotate_stacked_(qk, self.rotation_table(), num_prefix_tokens)

    def rotate_qk_heads_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        return _rotate_heads_(qk, self.rotation_table(), num_prefix_tokens)

    def rotate_qk_frames_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        return _rotate_frames_(qk, self.rotation_table(), num_prefix_tokens)

    def rotation_table(self) -> torch.Tensor:
        """(cos, sin) per channel pair at the fixed positions, ``[N, G * H, D/2, 2]`` (the buffer when the
        frequencies are fixed, recomputed when they are learned)."""
        if self.fixed_positions and not self.learnable:
            return self.rotation
        return torch.stack(self.cos_sin(), dim=-1)

    def rotate_qk(
        self, q: torch.Tensor, k: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = self.rotate_qk_tokens(q.transpose(1, 2), k.transpose(1, 2), num_prefix_tokens)
        return q.transpose(1, 2), k.transpose(1, 2)


class BoundFrameRoPE(PositionalScheme):
    """Frame RoPE with its angles already computed for one batch: cos/sin ``[B, N, G * H, D/2]``."""

    is_rotary = True

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        super().__init__()
        self.cos, self.sin = cos, sin
        self.rotation = torch.stack([cos, sin], dim=-1)  # once per batch, shared by all blocks

    def rotate_qk_tokens(
        self, q: torch.Tensor, k: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _rotate_tokens(q, k, self.rotation, num_prefix_tokens)

    def rotate_qk_stacked_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        return _rotate_stacked_(qk, self.rotation, num_prefix_tokens)

    def rotate_qk_heads_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        return _rotate_heads_(qk, self.rotation, num_prefix_tokens)

    def rotate_qk_frames_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        return _rotate_frames_(qk, self.rotation, num_prefix_tokens)


def _rotate_stacked_(qk: torch.Tensor, rotation: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Rotate ``qk [B, N, 2, G * H, D]`` (q and k stacked) in place in one op; prefix tokens stay as
    they are. ``rotation [..., N', G * H, D/2, 2]`` broadcasts over the q/k axis. Returns ``qk``."""
    rotate_pairs_(qk[:, num_prefix_tokens:], rotation.unsqueeze(-4))
    return qk


def _rotate_heads_(qk: torch.Tensor, rotation: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Rotate heads-major ``qk [2, B, G * H, N, D]`` (q and k stacked, timm's layout after the qkv
    permute) in place in one op; prefix tokens stay as they are. ``rotation [..., N', G * H, D/2, 2]``
    is read with its token and head axes swapped (a view). Returns ``qk``."""
    rotate_pairs_(qk[..., num_prefix_tokens:, :], rotation.transpose(-3, -4))
    return qk


def _rotate_frames_(qk: torch.Tensor, rotation: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Rotate frames-major ``qk [G, B, N, 2, H, D]`` in place in one op; prefix tokens stay as they are.
    ``rotation [N', G * H, D/2, 2]`` (fixed positions) or ``[B, N', G * H, D/2, 2]`` is viewed as
    ``[G, B or 1, N', 1, H, D/2, 2]``. Returns ``qk``."""
    G, H = qk.shape[0], qk.shape[4]
    rotation = rotation.unflatten(-3, (G, H)).movedim(-4, 0)  # [G, (B,) N', H, D/2, 2]
    if rotation.ndim == 5:
        rotation = rotation.unsqueeze(1)
    rotate_pairs_(qk[:, :, num_prefix_tokens:], rotation.unsqueeze(3))
    return qk


def _rotate_after_prefix(x: torch.Tensor, rotation: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """:func:`rotate_pairs` on the tokens (axis 1) after the first ``num_prefix_tokens``, which stay as they are."""
    p = num_prefix_tokens
    if not p:
        return rotate_pairs(x, rotation)
    return torch.cat([x[:, :p], rotate_pairs(x[:, p:], rotation)], dim=1)


def _rotate_tokens(
    q: torch.Tensor, k: torch.Tensor, rotation: torch.Tensor, num_prefix_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate token-major ``q, k [B, N, *heads, D]``, leaving the first ``num_prefix_tokens`` as they are.

    ``rotation [..., N', G * H, D/2, 2]`` (N' = N - num_prefix_tokens) is viewed with q's head dims.
    Returns ``[B, N, G * H, D]`` (contiguous).
    """
    B, N, D = q.shape[0], q.shape[1], q.shape[-1]
    rotation = rotation.reshape(*rotation.shape[:-3], *q.shape[2:-1], D // 2, 2)
    q, k = (_rotate_after_prefix(x, rotation, num_prefix_tokens).reshape(B, N, -1, D) for x in (q, k))
    return q, k
