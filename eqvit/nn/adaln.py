"""DiT's adaLN-Zero conditioning (Peebles and Xie 2023) on regular features ``[B, N, |G| C]``.

An invariant conditioning vector ``c [B, D]`` (the embedded diffusion time) is mapped to per-channel shifts,
scales and gates ``[B, C]``; each is repeated over the ``|G|`` frames, so it is a constant function on the
group. Scaling and shifting every frame of a channel by the same number commutes with the frames' permutation
``(L_g f)(R) = f(g^-1 R)``, so a modulated Platonic block stays equivariant. The modulation's linear map starts
at zero (the "Zero" of adaLN-Zero): every block starts as the identity and the conditioning is learned.

- :class:`TimestepEmbedding`: ``t [B] -> c [B, D]`` (sinusoids, then Linear-SiLU-Linear);
- :class:`FrameModulation`: ``c [B, D] -> k`` tiled vectors ``[B, 1, |G| C]``;
- :class:`AdaLNZeroBlock`: the pre-norm block with its norm, attention and MLP injected, modulated by ``c``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.init import vit_linear
from eqvit.nn.layers import DropPath
from eqvit.nn.posenc.base import PositionalScheme


class TimestepEmbedding(ExactBuffers):
    """``t [B] -> [B, dim]``: ``freq_dim`` sinusoids of ``scale * t`` (periods up to ``max_period``), then
    ``Linear -> SiLU -> Linear`` (DiT's timestep embedder; ``t`` in [0, 1], ``scale`` 1000 as DiT's steps)."""

    def __init__(self, dim: int, freq_dim: int = 256, scale: float = 1000.0, max_period: float = 10_000.0) -> None:
        super().__init__()
        if freq_dim % 2:
            raise ValueError(f"expected an even freq_dim (cos and sin pairs), got {freq_dim}")
        half = freq_dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64, device="cpu") / half) * scale
        self.register_exact_buffer("freqs", freqs)
        self.mlp = nn.Sequential(vit_linear(freq_dim, dim), nn.SiLU(), vit_linear(dim, dim))
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """``t [B] -> [B, dim]``."""
        angles = t[:, None].to(self.freqs.dtype) * self.freqs
        return self.mlp(torch.cat([angles.cos(), angles.sin()], dim=-1).to(self.mlp[0].weight.dtype))


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x (1 + scale) + shift``; ``shift, scale [B, 1, |G| C]`` broadcast over the tokens of ``x [B, N, |G| C]``."""
    return torch.addcmul(shift, x, 1 + scale)


class FrameModulation(nn.Module):
    """``c [B, D] -> chunks`` vectors ``[B, 1, |G| C]``: SiLU, a zero-initialised ``Linear(D -> chunks C)``, each
    chunk ``[B, C]`` repeated over the frames (frames-major, entry ``g C + c`` is channel ``c``)."""

    def __init__(self, group_order: int, channels: int, cond_dim: int, chunks: int) -> None:
        super().__init__()
        self.order, self.channels, self.chunks = group_order, channels, chunks
        self.act = nn.SiLU()
        self.linear = nn.Linear(cond_dim, chunks * channels)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def extra_repr(self) -> str:
        return f"order={self.order}, channels={self.channels}, chunks={self.chunks}"

    def forward(self, cond: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``c [B, D]`` -> ``chunks`` tensors ``[B, 1, |G| C]``."""
        per_channel = self.linear(self.act(cond)).unflatten(-1, (self.chunks, self.channels))  # [B, k, C]
        return per_channel.repeat(1, 1, self.order).unsqueeze(2).unbind(1)


class AdaLNZeroBlock(nn.Module):
    """DiT's block with adaLN-Zero on ``x [B, N, |G| C]`` conditioned on ``c [B, D]``::

        x = x + gate1 * attn(modulate(norm1(x), shift1, scale1), rope)
        x = x + gate2 * mlp(modulate(norm2(x), shift2, scale2))

    The six vectors come from ``modulation(c)`` (a :class:`FrameModulation` with six chunks); the gates start at
    zero, so the block starts as the identity. ``norm1, attn, norm2, mlp`` are the Platonic layers
    (frame-shared LayerNorms, frames-as-heads attention called ``attn(x, rope, 0)``, the group-convolution MLP).
    """

    def __init__(
        self,
        norm1: nn.Module,
        attn: nn.Module,
        norm2: nn.Module,
        mlp: nn.Module,
        modulation: FrameModulation,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        if modulation.chunks != 6:
            raise ValueError(f"expected a modulation with 6 chunks (shift, scale, gate twice), got {modulation.chunks}")
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp
        self.modulation = modulation
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    @property
    def in_type(self):
        return getattr(self.attn, "in_type", None)

    @property
    def out_type(self):
        return getattr(self.attn, "out_type", None)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, rope: PositionalScheme | None = None) -> torch.Tensor:
        """``x [B, N, |G| C]``, ``cond [B, D]`` -> ``[B, N, |G| C]``."""
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(cond)
        x = x + self.drop_path(gate1 * self.attn(modulate(self.norm1(x), shift1, scale1), rope, 0))
        return x + self.drop_path(gate2 * self.mlp(modulate(self.norm2(x), shift2, scale2)))
