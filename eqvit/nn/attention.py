"""Multi-head self-attention on ``F.scaled_dot_product_attention`` with pluggable rotary schemes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from eqvit.nn.init import vit_linear
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.sdpa import ScaledDotProductAttention


def _qk_view(qkv: torch.Tensor, q_norm: nn.Module, k_norm: nn.Module, dim: int) -> torch.Tensor:
    return qkv.narrow(dim, 0, 2)


def _qk_normed(qkv: torch.Tensor, q_norm: nn.Module, k_norm: nn.Module, dim: int) -> torch.Tensor:
    return torch.stack([q_norm(qkv.select(dim, 0)), k_norm(qkv.select(dim, 1))], dim=dim)


def qk_stacker(qk_norm: bool) -> Callable[[torch.Tensor, nn.Module, nn.Module, int], torch.Tensor]:
    """``stack(qkv, q_norm, k_norm, dim)``: the queries and keys of ``qkv`` (q, k, v along ``dim``) after their
    norms, stacked along ``dim`` so that a positional scheme rotates both in one op. Chosen at construction:
    without qk-norm it is a view of ``qkv`` (no copy), with it the two normed tensors stacked."""
    return _qk_normed if qk_norm else _qk_view


def qk_norms(head_dim: int, qk_norm: bool) -> tuple[nn.Module, nn.Module, Callable]:
    """``(q_norm, k_norm, stack)``: LayerNorms over the head dim ``D`` (or identities) and the matching
    :func:`qk_stacker`, what every attention with timm's ``qk_norm`` flag builds."""
    make = (lambda: nn.LayerNorm(head_dim)) if qk_norm else nn.Identity
    return make(), make(), qk_stacker(qk_norm)


class Attention(nn.Module):
    """timm-style attention: qkv projection, optional qk-norm, SDPA, output projection.

    Positional schemes that act on queries and keys (RoPE-like) are passed to ``forward`` and
    applied after the optional qk-norm, skipping the first ``num_prefix_tokens`` tokens. No
    dense mask is ever built, so SDPA's flash / memory-efficient kernels apply on GPU.

    Args:
        dim: token width C.
        num_heads: number of heads H (C must be divisible by H).
        qkv_bias: bias in the qkv projection.
        qk_norm: LayerNorm on q and k per head.
        attn_drop, proj_drop: dropout rates.
        fused: use SDPA (True) or the explicit reference softmax(q k^T / sqrt(d)) v (False).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused: bool = True,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"dim {dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.sdpa = ScaledDotProductAttention(attn_drop, fused)
        self.qkv = vit_linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm, self.k_norm, self._stack_qk = qk_norms(self.head_dim, qk_norm)
        self.proj = vit_linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    @property
    def fused(self) -> bool:
        return self.sdpa.fused

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, C]`` -> ``[B, N, C]``."""
        B, N, C = x.shape
        # Token-major [B, N, 3, H, D] until SDPA: RoPE-like schemes rotate per token, and in this
        # layout they need no transposes of their own. Queries and keys stay stacked, so a scheme
        # rotates both in one op, in place in this layer's own fresh projection (no copies).
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)
        qk = self._stack_qk(qkv, self.q_norm, self.k_norm, 2)
        if rope is not None:
            qk = rope.rotate_qk_stacked_(qk, num_prefix_tokens)
        q, k, v = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)  # [B, H, N, D]
        out = self.sdpa(q, k, v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(out))
