"""Point sets shared by the tests."""

import math

import torch


def fibonacci_sphere(n: int) -> torch.Tensor:
    """``[n, 3]`` float64 near-uniform unit vectors (golden spiral)."""
    i = torch.arange(n, dtype=torch.float64) + 0.5
    z = 1.0 - 2.0 * i / n
    phi = math.pi * (1.0 + 5.0**0.5) * i
    r = (1.0 - z * z).sqrt()
    return torch.stack((r * torch.cos(phi), r * torch.sin(phi), z), dim=1)
