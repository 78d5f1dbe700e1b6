"""Initialisation: every layer initialises itself at construction (the model never re-initialises)."""

from __future__ import annotations

from typing import Any

from torch import nn


def vit_linear(in_features: int, out_features: int, bias: bool = True, **factory: Any) -> nn.Linear:
    """``nn.Linear`` with timm's ViT init: truncated normal weights (std 0.02), zero bias."""
    linear = nn.Linear(in_features, out_features, bias=bias, **factory)
    nn.init.trunc_normal_(linear.weight, std=0.02)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
    return linear
