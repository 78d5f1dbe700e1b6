"""Token-wise building blocks: Mlp, DropPath, LayerScale and the transformer Block."""

from __future__ import annotations

import torch
from torch import nn

from eqvit.nn.attention import Attention
from eqvit.nn.posenc.base import PositionalScheme


def check_num_classes(num_classes: int) -> int:
    """``num_classes`` as an int, or a ValueError unless it is a non-negative integer (0: no classifier)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ValueError(f"expected num_classes to be a non-negative integer (0: no classifier), got {num_classes!r}")
    return num_classes


class Mlp(nn.Module):
    """Two-layer MLP applied per token: ``[B, N, C] -> [B, N, C_out]``."""

    def __init__(
        self, in_features: int, hidden_features: int | None = None, out_features: int | None = None, drop: float = 0.0
    ) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth per sample (identity at eval time)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty(x.shape[0], *([1] * (x.ndim - 1)), device=x.device, dtype=x.dtype).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, qkv_bias, qk_norm, attn_drop, drop, fused=fused_attn)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, C] -> [B, N, C]``."""
        x = x + self.drop_path1(self.attn(self.norm1(x), rope, num_prefix_tokens))
        return x + self.drop_path2(self.mlp(self.norm2(x)))
