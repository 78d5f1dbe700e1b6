"""Equivariant layers (torch.nn.Module)."""

from eqvit.nn.activation import FourierActivation
from eqvit.nn.attention import Attention
from eqvit.nn.irrep_attention import IrrepAttention
from eqvit.nn.irrep_blocks import InvariantHead, IrrepBlock, IrrepMlp
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Block, DropPath, Mlp
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.posenc import LatitudeEncoding, LearnedAPE, NoPositionalEncoding, PositionalScheme, SO3RoPE

__all__ = [
    "Attention",
    "Block",
    "DropPath",
    "FeatureType",
    "FourierActivation",
    "InvariantHead",
    "IrrepAttention",
    "IrrepBlock",
    "IrrepLayerNorm",
    "IrrepLinear",
    "IrrepMlp",
    "LatitudeEncoding",
    "LearnedAPE",
    "Mlp",
    "NoPositionalEncoding",
    "PositionalScheme",
    "SO3RoPE",
]
