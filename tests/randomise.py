"""Weight noise for the tests: timm's small-std init leaves paths nearly silent (a zero head makes a
fresh model output exactly zero), and an equivariance check on a silent model could not fail."""

from __future__ import annotations

import torch
from torch import nn


def randomise_(module: nn.Module, seed: int = 0, scale: float | None = None, skip: tuple[str, ...] = ()) -> nn.Module:
    """Add Gaussian noise to every parameter (except names starting with ``skip``), in place.

    The std is ``scale`` or, when None, ``1/sqrt(fan_in)`` for matrices and 0.1 otherwise.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.startswith(skip):
                continue
            std = scale if scale is not None else (p[0].numel() ** -0.5 if p.ndim >= 2 else 0.1)
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * std)
    return module
