"""The one attention kernel of eqvit: ``F.scaled_dot_product_attention``, beside a plain reference.

Every attention layout (timm's heads, coupled and irrep-wise heads, frames as heads) reshapes its
queries, keys and values to ``[B, H, N, D]`` and calls one :class:`ScaledDotProductAttention`. No
dense mask is ever built, so SDPA's flash and memory-efficient kernels apply on GPU; the reference
path spells the same computation out, so the two can be tested against each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """``softmax(q k^T / sqrt(D)) v`` written out: ``[B, H, N, D] x3 -> [B, H, N, D_v]``."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    return F.dropout(scores.softmax(dim=-1), dropout_p, training=dropout_p > 0) @ v


class ScaledDotProductAttention(nn.Module):
    """``(q, k, v) [B, H, N, D] -> [B, H, N, D_v]``; dropout on the attention weights while training.

    Args:
        dropout: dropout rate of the attention probabilities (inactive in ``eval()``).
        fused: ``F.scaled_dot_product_attention`` (True) or :func:`reference_attention` (False).
    """

    def __init__(self, dropout: float = 0.0, fused: bool = True) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"expected an attention dropout rate in [0, 1), got {dropout}")
        self.dropout = float(dropout)
        self.fused = fused

    @property
    def fused(self) -> bool:
        return self.kernel is F.scaled_dot_product_attention

    @fused.setter
    def fused(self, value: bool) -> None:
        # The kernel is picked here, once, so that forward has no branch on it.
        self.kernel = F.scaled_dot_product_attention if value else reference_attention

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}, fused={self.fused}"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.kernel(q, k, v, dropout_p=self.dropout if self.training else 0.0)
