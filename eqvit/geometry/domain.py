"""Domains: point sets that models read fields on, with the group action on those fields."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


class PointDomain:
    """Scalar fields on a finite point set that a group of orthogonal matrices permutes.

    A field is a tensor whose trailing ``len(shape)`` axes index the points in row-major order
    (``shape = (V,)`` for the icosphere, ``(H, W)`` for images). The action of g is
    ``(g . f)(p) = f(g^-1 p)``, i.e. the value at point i moves to point ``perm[i]`` where
    ``points[perm[i]] = g @ points[i]``.

    Args:
        points: ``[P, d]`` float64 point coordinates.
        shape: trailing tensor shape indexing the points (``prod(shape) == P``).
        name: description used in error messages, e.g. ``"icosphere level 5"``.
        weights: optional quadrature weights, ``prod(shape)`` values in point order.
    """

    def __init__(
        self,
        points: np.ndarray,
        shape: tuple[int, ...] | None = None,
        name: str = "domain",
        weights: np.ndarray | None = None,
    ) -> None:
        self.points = np.asarray(points, dtype=np.float64)
        # Quadrature weights (e.g. icosphere vertex areas), reshaped like the fields; optional.
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float64)
        self.shape = tuple(shape) if shape is not None else (len(self.points),)
        if int(np.prod(self.shape)) != len(self.points):
            raise ValueError(f"shape {self.shape} does not hold {len(self.points)} points")
        self.name = name
        self._permutation = lru_cache(maxsize=256)(self._compute_permutation)

    def __repr__(self) -> str:
        return f"PointDomain({self.name}, points={len(self.points)}, shape={self.shape})"

    def _compute_permutation(self, key: bytes) -> np.ndarray:
        from eqvit.geometry.points import point_permutation

        d = self.points.shape[1]
        return point_permutation(self.points, np.frombuffer(key, dtype=np.float64).reshape(d, d))

    def permutation(self, matrix: np.ndarray) -> np.ndarray:
        """int64 ``[P]`` with ``points[perm[i]] == matrix @ points[i]`` (cached per matrix)."""
        return self._permutation(np.ascontiguousarray(matrix, dtype=np.float64).tobytes())

    def check(self, x: torch.Tensor, channels: int | None = None) -> None:
        """ValueError unless ``x`` is ``[B, channels, *shape]``."""
        expected = ["B", channels if channels is not None else "C", *self.shape]
        ok = x.ndim == len(expected) and tuple(x.shape[2:]) == self.shape
        ok = ok and (channels is None or x.shape[1] == channels)
        if not ok:
            shown = ", ".join(str(s) for s in expected)
            raise ValueError(f"expected input of shape [{shown}] on {self.name}, got {list(x.shape)}")

    def act(self, matrix: np.ndarray, x: torch.Tensor) -> torch.Tensor:
        """Apply the group element ``matrix`` to the field ``x [..., *shape]``."""
        perm = torch.as_tensor(self.permutation(matrix), device=x.device)
        flat = x.reshape(*x.shape[: x.ndim - len(self.shape)], -1)
        out = torch.empty_like(flat)
        out[..., perm] = flat
        return out.reshape(x.shape)
