"""The inference form of frames-as-heads attention (``eqvit.fuse`` of a :class:`PlatonicAttention`).

With the head gather folded into the qkv rows, the frames-as-heads layer is timm's attention with
``|G| H`` heads plus the rotary scheme: one matmul, a view to ``[3, B, |G| H, N, D]``, the rotation of
q and k in place (one complex multiply), SDPA, the output projection. The training layer
(:class:`~eqvit.nn.platonic.PlatonicAttention`) keeps its q/k-norm and dropout slots; this one is
built only for the layers that have neither.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eqvit.nn.posenc.base import PositionalScheme


class FrozenFrameAttention(nn.Module):
    """``x [B, N, |G| C] -> [B, N, |G| C]``: frames-as-heads attention with fixed weights.

    Args:
        weight, bias: the qkv projection ``[3 |G| C, |G| C]`` with rows in (q/k/v, frame, head, d) order.
        proj_weight, proj_bias: the output projection.
        heads: ``|G| H``; head_dim: D.
        sdpa: the attention kernel module of the layer (SDPA or the reference path).
        in_type: the features' type (frames).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        proj_weight: torch.Tensor,
        proj_bias: torch.Tensor | None,
        heads: int,
        head_dim: int,
        sdpa: nn.Module,
        in_type=None,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().clone().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone().contiguous())
        self.register_buffer("proj_weight", proj_weight.detach().clone().contiguous())
        self.register_buffer("proj_bias", None if proj_bias is None else proj_bias.detach().clone().contiguous())
        self.heads, self.head_dim = heads, head_dim
        self.sdpa = sdpa
        self.in_type = self.out_type = in_type

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}"

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, |G| C] -> [B, N, |G| C]``."""
        B, N, _ = x.shape
        qkv = F.linear(x, self.weight, self.bias).view(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if rope is not None:  # frame RoPE on q and k in place (qkv is this call's own output)
            rope.rotate_qk_heads_(qkv[:2], num_prefix_tokens)
        q, k, v = qkv.unbind(0)
        out = self.sdpa(q, k, v).transpose(1, 2).reshape(B, N, -1)
        return F.linear(out, self.proj_weight, self.proj_bias)
