"""Positional schemes behind one interface (:class:`PositionalScheme`)."""

from eqvit.nn.posenc.base import NoPositionalEncoding, PositionalScheme
from eqvit.nn.posenc.frame_rope import BoundFrameRoPE, FrameRoPE
from eqvit.nn.posenc.latitude import LatitudeEncoding, legendre_polynomials
from eqvit.nn.posenc.learned import LearnedAPE, OrbitAPE
from eqvit.nn.posenc.registry import (
    TokenLayout,
    build_posenc,
    list_posencs,
    register_posenc,
    unregister_posenc,
)
from eqvit.nn.posenc.so3rope import SO3RoPE, max_order_for

__all__ = [
    "BoundFrameRoPE",
    "FrameRoPE",
    "LatitudeEncoding",
    "LearnedAPE",
    "NoPositionalEncoding",
    "OrbitAPE",
    "PositionalScheme",
    "SO3RoPE",
    "TokenLayout",
    "build_posenc",
    "legendre_polynomials",
    "list_posencs",
    "max_order_for",
    "register_posenc",
    "unregister_posenc",
]
