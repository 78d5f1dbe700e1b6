"""Learned absolute position embedding (breaks every symmetry; the non-equivariant ablation)."""

from __future__ import annotations

import torch
from torch import nn

from eqvit.nn.posenc.base import PositionalScheme


class LearnedAPE(PositionalScheme):
    """A learned vector per token position, added after tokenization: ``x + p``, ``p [1, N, C]``."""

    def __init__(self, num_tokens: int, dim: int, std: float = 0.02) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(torch.randn(1, num_tokens, dim) * std)

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.pos_embed.shape[1]:
            raise ValueError(f"expected {self.pos_embed.shape[1]} tokens, got {x.shape[1]}")
        return x + self.pos_embed
