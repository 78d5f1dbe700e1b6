"""Attention in another basis: the adapters that make positional schemes and head layouts interchangeable.

For multiples of the regular representation the frame basis and the irrep basis hold the same
features, related by the orthogonal group Fourier transform (:attr:`FeatureType.fourier`). Frame RoPE
and frames-as-heads act in the frame basis; coupled and irrep-wise heads in the irrep basis. The
modules here move queries, keys and values between the two with fixed orthogonal matrices (float64
masters, chosen at construction), so every (scheme, layout) pair is built from the same layers:

* :class:`HeadBasis` / :class:`IdentityBasis`: an attention's heads laid out in another basis of its
  features (``u = x @ T``); the change is folded into the rows of q, k, v and the columns of the
  output projection, so it costs nothing per token (frames-as-heads on irrep-wise features);
* :class:`FrameRotary` / :class:`NoRotary`: frame RoPE on queries and keys held in any basis: to
  frames, rotate the frames-major heads, back (frame RoPE with coupled or irrep-wise heads);
* :class:`AttentionInBasis`: a whole attention layer run in another basis of its features
  (irrep-wise heads on Platonic frame features).

Equivariance: ``T`` intertwines the two actions, so a head that is a G-stable (or G-permuted) set of
coordinates in one basis gives invariant (or permuted) scores; frame RoPE satisfies
``rot(g p) P_g = P_g rot(p)`` in the frame basis, so after the change back the rotated queries and keys
transform like the unrotated ones, and any G-stable head layout keeps the scores invariant.
"""

from __future__ import annotations

import numpy as np
import torch

from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType


class IdentityBasis(torch.nn.Module):
    """Heads in the features' own basis: q, k, v and projection weights as they come."""

    def rows(self, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return weight, bias

    def columns(self, weight: torch.Tensor) -> torch.Tensor:
        return weight


class HeadBasis(ExactBuffers):
    """Heads in the basis ``u = x @ T`` (``T [dim, dim]`` orthogonal, row vectors).

    A layer ``y = W x + b`` read in that basis is ``T^T W, T^T b`` (:meth:`rows`); a projection reading
    ``u`` is ``W T`` (:meth:`columns`).
    """

    def __init__(self, matrix: np.ndarray) -> None:
        super().__init__()
        self.register_exact_buffer("matrix", torch.from_numpy(np.array(matrix, dtype=np.float64)))

    def rows(self, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = self.matrix.to(weight.dtype).T
        return t @ weight, None if bias is None else t @ bias

    def columns(self, weight: torch.Tensor) -> torch.Tensor:
        return weight @ self.matrix.to(weight.dtype)


class NoRotary(torch.nn.Module):
    """No rotary scheme: the stacked ``qkv [B, N, 3 dim]`` passes unchanged (a ValueError if one is given)."""

    def forward(self, qkv: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        self.check(rope)
        return qkv

    @staticmethod
    def check(rope) -> None:
        """ValueError if a rotary scheme is given (for attentions that skip calling this module on q/k/v)."""
        if rope is not None:
            raise ValueError(
                "this attention was built without a rotary scheme; build the model with posenc='frame_rope' "
                "to use frame RoPE"
            )


class FrameRotary(ExactBuffers):
    """Frame RoPE on queries and keys held in another basis of C copies of the regular representation.

    ``q [B, N, dim]`` (the attention's layout, e.g. irrep-wise heads side by side) -> frames
    ``q @ to_frames`` ``[B, N, |G|, C]`` -> the first ``rope_heads * rope_head_dim`` channels of every
    frame rotated as frames-major heads ``[B, N, |G| rope_heads, rope_head_dim]`` by the scheme (the
    remaining channels, at most one when C is odd, pass through) -> back with ``to_frames^T``. Values
    are not touched.

    Args:
        group_order: |G|.
        channels: C per frame.
        to_frames: ``[dim, dim]`` orthogonal, ``q_layout @ to_frames`` = q in the frame basis.
        rope_heads, rope_head_dim: the head split the scheme's rotation table was built for.
    """

    def __init__(
        self, group_order: int, channels: int, to_frames: np.ndarray, rope_heads: int, rope_head_dim: int
    ) -> None:
        super().__init__()
        if rope_heads * rope_head_dim > channels or rope_head_dim % 2 or rope_head_dim < 2:
            raise ValueError(
                f"frame RoPE with {rope_heads} heads of {rope_head_dim} channels does not fit {channels} "
                "channels per frame (it rotates pairs: at least 2 channels per frame)"
            )
        self.order, self.channels = group_order, channels
        self.rope_heads, self.rope_head_dim = rope_heads, rope_head_dim
        self.used = rope_heads * rope_head_dim
        self.dim = group_order * channels
        self.register_exact_buffer("to_frames", torch.from_numpy(np.array(to_frames, dtype=np.float64)))

    def extra_repr(self) -> str:
        return f"frames={self.order}, channels={self.channels}, rope heads {self.rope_heads} x {self.rope_head_dim}"

    def forward(self, qkv: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        if rope is None:
            raise ValueError("this attention was built for frame RoPE: pass the model's rotary scheme")
        q, k, v = qkv.split(self.dim, dim=-1)
        to_frames = self.to_frames.to(qkv.dtype)
        qf, kf = ((t @ to_frames).unflatten(-1, (self.order, self.channels)) for t in (q, k))
        heads = (self.rope_heads, self.rope_head_dim)
        # (contiguous: the rotation views channel pairs as complex numbers, which needs even strides)
        rq, rk = rope.rotate_qk_tokens(
            qf[..., : self.used].contiguous().unflatten(-1, heads),
            kf[..., : self.used].contiguous().unflatten(-1, heads),
            num_prefix_tokens,
        )
        rq, rk = (r.reshape(*qf.shape[:-1], self.used) for r in (rq, rk))
        if self.used < self.channels:
            rq, rk = torch.cat([rq, qf[..., self.used :]], -1), torch.cat([rk, kf[..., self.used :]], -1)
        q, k = (r.flatten(-2) @ to_frames.T for r in (rq, rk))
        return torch.cat([q, k, v], dim=-1)


class AttentionInBasis(ExactBuffers):
    """An attention layer run in another basis of its features: ``inner(x @ A, rope) @ A^T``.

    ``A = outer_type.fourier`` (frames -> the irrep basis), so irrep-wise heads serve Platonic
    frame features. :meth:`fold` folds ``A`` into the inner layer's projections.

    Args:
        inner: the attention on ``x @ A`` (its ``in_type`` is the type of those coordinates).
        outer_type: the features' type.
        to_inner: ``A [dim, dim]`` orthogonal, intertwining ``outer_type``'s action with ``inner.in_type``'s
            (default: the Fourier transform, with ``inner.in_type`` the irrep-basis type; a restricted
            model passes its own).
    """

    def __init__(self, inner: torch.nn.Module, outer_type: FeatureType, to_inner: np.ndarray | None = None) -> None:
        super().__init__()
        if to_inner is None:
            if inner.in_type != outer_type.in_irrep_basis():
                raise ValueError(f"the inner attention reads {inner.in_type}, expected {outer_type.in_irrep_basis()}")
            to_inner = outer_type.fourier
        to_inner = np.array(to_inner, dtype=np.float64)
        if to_inner.shape != (outer_type.dim, inner.in_type.dim):
            raise ValueError(
                f"expected a [{outer_type.dim}, {inner.in_type.dim}] change of basis, got {list(to_inner.shape)}"
            )
        self.inner = inner
        self.in_type = self.out_type = outer_type
        self.register_exact_buffer("to_inner", torch.from_numpy(to_inner))

    def forward(self, x: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        a = self.to_inner.to(x.dtype)
        return self.inner(x @ a, rope, num_prefix_tokens) @ a.T

    def fold(self) -> torch.nn.Module:
        """The inference form: ``A`` folded into the inner attention's qkv columns and projection rows, its
        dense weights fixed (:class:`~eqvit.nn.folded.FoldedIrrepAttention`)."""
        from eqvit.nn.folded import FoldedIrrepAttention

        a = self.to_inner
        qkv_w, qkv_b, proj_w, proj_b = self.inner.stacked_weights()
        weights = (qkv_w @ a.T, qkv_b, a.to(proj_w.dtype) @ proj_w, None if proj_b is None else a @ proj_b)
        return FoldedIrrepAttention(self.inner, weights, in_type=self.in_type)


def permutation_matrix(perm: np.ndarray) -> np.ndarray:
    """``P [n, n]`` with ``x[..., perm] @ P == x``: from coordinates laid out in ``perm`` order back."""
    P = np.zeros((len(perm), len(perm)))
    P[np.arange(len(perm)), perm] = 1.0
    return P
