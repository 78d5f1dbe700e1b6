"""One interface for positional schemes.

A scheme either adds to the token sequence (absolute encodings: ``add_to_tokens``) or rotates
queries and keys inside attention (RoPE-like: ``rotate_qk``). ``is_rotary`` says which, so the
ViT decides once, at construction, where the scheme goes.
"""

from __future__ import annotations

import torch
from torch import nn

from eqvit.nn.irrep_features import FeatureType


class PositionalScheme(nn.Module):
    """Base class; the defaults leave tokens, queries and keys unchanged.

    ``is_rotary``: it rotates queries and keys (else it adds to the tokens). ``keeps_symmetry``: the model keeps
    the symmetry of its tokens with it (False for an absolute encoding learned per token).
    ``rotary_split``: ``(heads, head_dim)`` of a scheme that rotates queries and keys in the frame basis (frame
    RoPE), which the O(2) models' attention moves them to; None otherwise.
    """

    is_rotary: bool = False
    keeps_symmetry: bool = True
    rotary_split: tuple[int, int] | None = None
    # The feature type the scheme reads and writes (the tokens, or the queries and keys of a rotary scheme);
    # None for plain features, on which no group acts through the channels (SO(3)-RoPE's, a learned APE's).
    in_type: FeatureType | None = None
    out_type: FeatureType | None = None

    def rope_for(self, *inputs: torch.Tensor) -> PositionalScheme | None:
        """The rotary scheme attention applies for these (encoded) model inputs: None for additive
        schemes, the scheme itself when its positions are fixed (a grid); schemes whose positions
        come with the input (point clouds) bind them here, once per forward."""
        return self if self.is_rotary else None

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, N, C]`` -> ``[B, N, C]`` (prefix tokens excluded by the caller)."""
        return x

    def rotate_qk(
        self, q: torch.Tensor, k: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q, k [B, H, N, D]`` -> embedded ``q, k`` of the same shape."""
        return q, k

    def rotate_qk_tokens(
        self, q: torch.Tensor, k: torch.Tensor, num_prefix_tokens: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same as :meth:`rotate_qk` for token-major ``q, k [B, N, H, D]`` (what attention holds).

        The heads may come unflattened, ``[B, N, G, H, D]`` (frames-major, as Platonic attention
        splits them off its stacked projection); the result is always ``[B, N, G * H, D]``. Schemes
        override it when the token-major layout is faster for them.
        """
        q, k = q.flatten(2, -2), k.flatten(2, -2)
        q, k = self.rotate_qk(q.transpose(1, 2), k.transpose(1, 2), num_prefix_tokens)
        return q.transpose(1, 2), k.transpose(1, 2)

    def rotate_qk_stacked_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        """:meth:`rotate_qk_tokens` in place on queries and keys stacked as ``qk [B, N, 2, H, D]``
        (q then k; typically a view into the attention's own stacked qkv output). Returns ``qk``.

        Schemes that can rotate both in one op, without a copy, override it.
        """
        q, k = self.rotate_qk_tokens(qk[:, :, 0], qk[:, :, 1], num_prefix_tokens)
        return qk.copy_(torch.stack([q, k], dim=2))

    def rotate_qk_heads_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        """:meth:`rotate_qk` in place on heads-major ``qk [2, B, H, N, D]`` (timm's layout after the qkv
        permute). Returns ``qk``. Schemes that rotate in one op, without a copy, override it."""
        q, k = self.rotate_qk(qk[0], qk[1], num_prefix_tokens)
        return qk.copy_(torch.stack([q, k]))

    def rotate_qk_frames_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        """:meth:`rotate_qk_stacked_` in place on frames-major ``qk [G, B, N, 2, H, D]`` (frame j's heads are
        ``j H .. j H + H - 1``; the layout of the Fourier-basis Platonic attention, eqvit.fold). Returns ``qk``.
        Frame schemes rotate it in one op; the default goes through the token-major layout (a copy)."""
        G, B, N, _, H, D = qk.shape
        stacked = qk.permute(1, 2, 3, 0, 4, 5).reshape(B, N, 2, G * H, D)
        rotated = self.rotate_qk_stacked_(stacked, num_prefix_tokens)
        return qk.copy_(rotated.view(B, N, 2, G, H, D).permute(3, 0, 1, 2, 4, 5))


class NoPositionalEncoding(PositionalScheme):
    """No positional information: attention is permutation equivariant."""

    def fold_in_stream(self, basis: nn.Module) -> NoPositionalEncoding:
        """Itself: adding nothing is the same in every basis of the stream (:mod:`eqvit.nn.stream`)."""
        return self
