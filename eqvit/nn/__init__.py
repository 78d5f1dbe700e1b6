"""Equivariant layers (torch.nn.Module)."""

from eqvit.nn.activation import FourierActivation
from eqvit.nn.attention import Attention
from eqvit.nn.irrep_attention import IrrepAttention
from eqvit.nn.irrep_blocks import ClassTokenHead, IrrepMlp, TokenInvariants, irrep_block
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Block, DropPath, FeatureGather, Mlp, vit_block
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.platonic import (
    FourierPlatonicAttention,
    FourierToFrames,
    FramePool,
    FramePoolDense,
    FrameProjectedAttention,
    InvariantPoolHead,
    PlatonicAttention,
    PlatonicMlp,
    platonic_block,
)
from eqvit.nn.posenc import (
    FrameRoPE,
    LatitudeEncoding,
    LearnedAPE,
    NoPositionalEncoding,
    PositionalScheme,
    SO3RoPE,
)
from eqvit.nn.regular import (
    FourierLayerNorm,
    GroupConvLinear,
    LiftToGroup,
    RegularBasis,
    RegularLayerNorm,
    RegularLayerScale,
    frame_action,
)

__all__ = [
    "Attention",
    "Block",
    "ClassTokenHead",
    "DropPath",
    "FeatureGather",
    "FeatureType",
    "FourierActivation",
    "FourierLayerNorm",
    "FourierPlatonicAttention",
    "FourierToFrames",
    "FramePool",
    "FramePoolDense",
    "FrameProjectedAttention",
    "FrameRoPE",
    "GroupConvLinear",
    "InvariantPoolHead",
    "IrrepAttention",
    "IrrepLayerNorm",
    "IrrepLinear",
    "IrrepMlp",
    "LatitudeEncoding",
    "LearnedAPE",
    "LiftToGroup",
    "Mlp",
    "NoPositionalEncoding",
    "PlatonicAttention",
    "PlatonicMlp",
    "PositionalScheme",
    "RegularBasis",
    "RegularLayerNorm",
    "RegularLayerScale",
    "SO3RoPE",
    "TokenInvariants",
    "frame_action",
    "irrep_block",
    "platonic_block",
    "vit_block",
]
