"""Square pixel grids."""

from __future__ import annotations

import numpy as np

__all__ = ["square_grid"]


def square_grid(height: int, width: int) -> np.ndarray:
    """``[H * W, 2]`` float64 pixel centres of an ``H x W`` image, centred at the origin.

    Row-major order, so index ``row * W + col`` is pixel ``[row, col]`` of an image tensor
    ``[..., H, W]`` flattened: ``x = col - (W - 1) / 2`` (to the right) and
    ``y = (H - 1) / 2 - row`` (up; row 0 is the top). Unit pixel spacing. Closed under D4
    (``R(pi / 2)`` and ``diag(1, -1)``) when ``H == W``; under D2 otherwise.
    """
    for name, n in (("height", height), ("width", width)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"expected {name} to be a positive integer, got {n!r}")
    row, col = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    x = col.ravel() - (width - 1) / 2
    y = (height - 1) / 2 - row.ravel()
    return np.stack([x, y], 1).astype(np.float64)
