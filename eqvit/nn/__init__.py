"""Equivariant layers (torch.nn.Module)."""

from eqvit.nn.attention import Attention
from eqvit.nn.layers import Block, DropPath, Mlp
from eqvit.nn.posenc import LatitudeEncoding, LearnedAPE, NoPositionalEncoding, PositionalScheme, SO3RoPE

__all__ = [
    "Attention",
    "Block",
    "DropPath",
    "LatitudeEncoding",
    "LearnedAPE",
    "Mlp",
    "NoPositionalEncoding",
    "PositionalScheme",
    "SO3RoPE",
]
