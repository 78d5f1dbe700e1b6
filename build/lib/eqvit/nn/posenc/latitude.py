"""Latitude encoding: symmetry breaking for the rotating sphere (SO(3)-RoPE seed, Sec. 3).

Adds a learned combination of Legendre polynomials P_1..P_c(cos beta) of each point's
colatitude beta to the input signal. cos beta = z is preserved exactly by the rotations about
the z-axis and by nothing else in the icosahedral group, so the model keeps exactly C5.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from eqvit.nn.buffers import ExactBuffers


def legendre_polynomials(x: np.ndarray, degree: int) -> np.ndarray:
    """``[len(x), degree]`` values P_1(x)..P_degree(x) by Bonnet's recursion (float64)."""
    out = np.empty((len(x), degree + 1))
    out[:, 0] = 1.0
    if degree >= 1:
        out[:, 1] = x
    for n in range(1, degree):
        out[:, n + 1] = ((2 * n + 1) * x * out[:, n] - n * out[:, n - 1]) / (n + 1)
    return out[:, 1:]


class LatitudeEncoding(ExactBuffers):
    """``x [B, C, V] -> x + W P(cos beta)`` with ``W [C, degree]`` learned (initialised at zero).

    Args:
        points: ``[V, 3]`` unit vectors of the input grid.
        channels: C, the number of input channels.
        degree: c, the number of Legendre polynomials.
    """

    def __init__(self, points: np.ndarray, channels: int, degree: int = 8) -> None:
        super().__init__()
        z = np.clip(np.asarray(points, dtype=np.float64)[:, 2], -1.0, 1.0)
        self.register_exact_buffer("legendre", torch.from_numpy(legendre_polynomials(z, degree)).T.contiguous())
        self.weight = nn.Parameter(torch.zeros(channels, degree))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.weight.to(x.dtype) @ self.legendre.to(x.dtype))
