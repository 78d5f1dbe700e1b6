"""SO(3)-RoPE (SO(3)-RoPE seed, Definition 1 and eq. 6).

Each query/key of a token at pose R is multiplied by pi(R) = D^0(R) + D^1(R) + ... + D^L(R)
(block diagonal, each order once, (L+1)^2 <= head_dim); the remaining channels pass through.
Since pi is orthogonal and a homomorphism, <pi(U) q, pi(V) k> = q^T pi(U^-1 V) k: attention
scores depend on relative poses only.
"""

from __future__ import annotations

import math

import torch

from eqvit.groups.so3 import wigner_D_blocks
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.posenc.base import PositionalScheme


def max_order_for(head_dim: int) -> int:
    """Largest L with (L+1)^2 <= head_dim."""
    if head_dim < 1:
        raise ValueError(f"head_dim must be positive, got {head_dim}")
    return math.isqrt(head_dim) - 1


class SO3RoPE(ExactBuffers, PositionalScheme):
    """Rotary embedding with real Wigner-D blocks of orders 0..L.

    Args:
        head_dim: channels per head D; the first (L+1)^2 are rotated.
        poses: optional fixed token poses ``[N, 3, 3]``; their block-diagonal Wigner-D matrices
            are precomputed once as a buffer and used by ``rotate_qk``.
        max_order: L; defaults to the largest that fits.
        wigner: instead of ``poses``, their matrices pi ``[N, (L+1)^2, (L+1)^2]`` (what
            :func:`eqvit.fold` passes on to the inference form).
    """

    is_rotary = True

    def __init__(
        self,
        head_dim: int,
        poses: torch.Tensor | None = None,
        max_order: int | None = None,
        *,
        wigner: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        L = max_order_for(head_dim) if max_order is None else max_order
        if (L + 1) ** 2 > head_dim or L < 0:
            raise ValueError(f"max_order {L} needs (L+1)^2 = {(L + 1) ** 2} channels, head_dim is {head_dim}")
        self.head_dim = head_dim
        self.max_order = L
        self.rotated_dim = k = (L + 1) ** 2
        if poses is not None and wigner is not None:
            raise ValueError("pass the token poses or their Wigner-D matrices, not both")
        if poses is not None:
            self._check_poses(poses)
            wigner = wigner_D_blocks(L, poses.to(torch.float64))
        if wigner is None:
            self.pi = self.pi_t_moving = None
            return
        if wigner.ndim != 3 or wigner.shape[1:] != (k, k):
            raise ValueError(f"expected Wigner-D matrices [N, {k}, {k}] at order {L}, got {list(wigner.shape)}")
        self.register_exact_buffer("pi", wigner)
        # For the in-place path (x @ pi^T per token): the transposed blocks of orders 1..L only.
        # Order 0 is the identity, and dropping it leaves 24 x 24 matrices at L = 4, which
        # batched matmul runs faster than 25 x 25 ones (aligned to the vector width).
        self.register_exact_buffer("pi_t_moving", wigner[:, 1:, 1:].transpose(-1, -2).contiguous())

    def _check_poses(self, poses: torch.Tensor) -> None:
        if poses.ndim not in (3, 4) or poses.shape[-2:] != (3, 3):
            raise ValueError(f"expected poses of shape [N, 3, 3] or [B, N, 3, 3], got {list(poses.shape)}")

    def representation(self, poses: torch.Tensor) -> torch.Tensor:
        """pi(R): ``[..., (L+1)^2, (L+1)^2]`` for ``poses [..., 3, 3]``."""
        return wigner_D_blocks(self.max_order, poses)

    def embed(self, x: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
        """``x [B, H, N, D]`` times ``pi [N, k, k]`` or ``[B, N, k, k]`` on its first k channels."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"expected head_dim {self.head_dim}, got x of shape {list(x.shape)}")
        k = self.rotated_dim
        pi = pi.to(x.dtype)
        if pi.ndim == 3:
            rotated = torch.einsum("nij,bhnj->bhni", pi, x[..., :k])
        else:
            rotated = torch.einsum("bnij,bhnj->bhni", pi, x[..., :k])
        return torch.cat([rotated, x[..., k:]], dim=-1) if k < self.head_dim else rotated

    def forward(self, x: torch.Tensor, poses: torch.Tensor) -> torch.Tensor:
        """``rope(x, poses)``: ``x [B, H, N, D]``, ``poses [N, 3, 3]`` or ``[B, N, 3, 3]``."""
        self._check_poses(poses)
        if poses.shape[-3] != x.shape[-2]:
            raise ValueError(f"got {poses.shape[-3]} poses for {x.shape[-2]} tokens")
        return self.embed(x, self.representation(poses))

    def rotate_qk_tokens(
        self, q: torch.Tensor, k: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-major ``q, k [B, N, H, D]``: stacked once, then :meth:`rotate_qk_stacked_`."""
        q, k = q.flatten(2, -2), k.flatten(2, -2)  # heads may come unflattened (see the base class)
        qk = self.rotate_qk_stacked_(torch.stack((q, k), dim=2), num_prefix_tokens)
        return qk[:, :, 0], qk[:, :, 1]

    def rotate_qk_stacked_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        """In place on ``qk [B, N, 2, H, D]`` (q then k; typically a view into attention's qkv output).

        One matmul over tokens broadcast over the batch, ``[B, N, 2 H, k - 1] @ pi_t_moving [N, k - 1, k - 1]``,
        read from and written back to a strided view of channels 1..k-1 of every query and key head:
        no stack, cat or transpose copies; channel 0 (order 0, invariant) and the channels past k are
        never touched. Returns ``qk``.
        """
        self._check_fixed(qk, num_prefix_tokens, token_axis=1)
        self._rotate_rows_(self._rows(qk, num_prefix_tokens))
        return qk

    def _rows(self, qk: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
        """The posed tokens' query and key heads of ``qk [B, N, 2, H, D]`` as rows ``[B, N - p, 2 H, D]`` (a view)."""
        B, N = qk.shape[:2]
        # view, not reshape: a copy here would silently drop the in-place write
        return qk.view(B, N, 2 * qk.shape[3], self.head_dim)[:, num_prefix_tokens:]

    def _rotate_rows_(self, rows: torch.Tensor) -> None:
        """In place on the rows (query and key heads) of the posed tokens, ``rows [B, N, 2 H, D]``."""
        # At L = 0 (pi = D^0 = 1) the channel slice is empty and so is the matmul: nothing moves.
        moving = rows[..., 1 : self.rotated_dim]
        # One matmul broadcast over the batch (no Python loop over samples: the batch stays a free size for
        # torch.export), written back in place.
        moving.copy_(torch.matmul(moving, self.pi_t_moving.to(rows.dtype)))

    def _check_fixed(self, x: torch.Tensor, num_prefix_tokens: int, token_axis: int) -> None:
        if self.pi is None:
            raise ValueError("SO3RoPE was built without fixed poses; call rope(x, poses) instead")
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"expected head_dim {self.head_dim}, got shape {list(x.shape)}")
        tokens = x.shape[token_axis] - num_prefix_tokens
        if tokens != self.pi.shape[0]:
            raise ValueError(
                f"expected {self.pi.shape[0]} tokens after {num_prefix_tokens} prefix tokens, got {x.shape[token_axis]}"
            )

    def rotate_qk(
        self, q: torch.Tensor, k: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pi is None:
            raise ValueError("SO3RoPE was built without fixed poses; call rope(x, poses) instead")
        p = num_prefix_tokens
        if q.shape[-2] - p != self.pi.shape[0]:
            raise ValueError(f"expected {self.pi.shape[0]} tokens after {p} prefix tokens, got {q.shape[-2]}")
        if p == 0:
            return self.embed(q, self.pi), self.embed(k, self.pi)
        q = torch.cat([q[..., :p, :], self.embed(q[..., p:, :], self.pi)], dim=-2)
        k = torch.cat([k[..., :p, :], self.embed(k[..., p:, :], self.pi)], dim=-2)
        return q, k
