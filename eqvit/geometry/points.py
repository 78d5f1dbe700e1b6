"""How an orthogonal matrix permutes a finite point set.

Convention (used everywhere in eqvit): a permutation ``perm`` for a matrix ``g`` maps the index of
a point to the index of its image, ``points[perm[i]] == g @ points[i]``. A field ``f`` on the
points then transforms as ``(g . f)[perm[i]] = f[i]``, i.e. ``out[..., perm] = f``.

Matching is O(P log P) and numpy-only (no KD-tree, no scipy): the points are projected onto one
fixed direction ``u`` with irrational component ratios and sorted once; each image ``g @ p`` is
looked up with ``searchsorted`` in the window ``[u.(g p) - atol, u.(g p) + atol]`` (a point
within Euclidean distance ``atol`` of the image projects into that window since ``|u| = 1``),
and the few candidates in the window are compared by their full Euclidean distance. On the
lattices and spheres used here the windows hold a single point, so a lookup is two binary
searches.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PointIndex", "fibonacci_sphere", "permutations_for", "point_permutation"]

# A fixed direction whose component ratios are transcendental, so no two distinct points with
# algebraic coordinates (lattices with sqrt(3), icospheres with sqrt(5)) project to one value.
_DIRECTION = np.array([1.0, 1.0 / np.pi, 1.0 / np.e, np.pi / 10.0, np.e / 10.0, 0.1 / np.pi])

# Largest number of (failing point x point) distances computed to report the exact deviation.
_REPORT_BUDGET = 2**25


def _direction(d: int) -> np.ndarray:
    if d <= len(_DIRECTION):
        u = _DIRECTION[:d].copy()
    else:
        u = np.sqrt(np.arange(2, d + 2, dtype=np.float64)) + 1.0 / np.pi
    return u / np.linalg.norm(u)


def _as_points(points: np.ndarray) -> np.ndarray:
    arr = np.asarray(points, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"expected points of shape [P, d] with P, d >= 1, got {list(np.shape(points))}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("points contain NaN or infinite coordinates")
    return arr


class PointIndex:
    """A point set sorted once along a fixed direction, for repeated permutation look-ups.

    Args:
        points: ``[P, d]`` coordinates; converted to float64.
        atol: Euclidean distance within which an image is matched to a point.

    Raises:
        ValueError: if two points lie within ``atol`` of each other (matching would be ambiguous).
    """

    def __init__(self, points: np.ndarray, atol: float = 1e-9) -> None:
        if not atol > 0:
            raise ValueError(f"expected atol > 0, got {atol!r}")
        self.points = _as_points(points)
        self.atol = float(atol)
        self.direction = _direction(self.points.shape[1])
        proj = self.points @ self.direction
        self._order = np.argsort(proj, kind="stable")
        self._sorted = proj[self._order]
        # Duplicates: two points within atol project within atol, so they are neighbours (or share
        # a window) in sorted order; checking the identity finds them.
        self.find(self.points)

    def __len__(self) -> int:
        return len(self.points)

    def find(self, queries: np.ndarray) -> np.ndarray:
        """Index of the point within ``atol`` of each query, int64 ``[Q]``.

        Raises:
            ValueError: if a query has no point within ``atol`` (message gives the largest
                distance from a query to its nearest point), or more than one.
        """
        queries = np.asarray(queries, dtype=np.float64)
        found, hits = self._match(queries)
        if np.any(hits > 1):
            raise ValueError(
                f"{int(np.sum(hits > 1))} queries have several points within atol={self.atol:g}; "
                "the point set has (near-)duplicate points"
            )
        missing = np.nonzero(hits == 0)[0]
        if len(missing):
            dev, exact = self._deviation(queries[missing])
            bound = "" if exact else "at least "
            raise ValueError(
                f"{len(missing)} of {len(queries)} points have no match within atol={self.atol:g}: "
                f"max deviation {bound}{dev:.3e}"
            )
        return found

    def _match(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each query ``[Q, d]``: the index of a point within ``atol`` (-1 if none) and how many there are."""
        if queries.ndim != 2 or queries.shape[1] != self.points.shape[1]:
            raise ValueError(f"expected queries of shape [Q, {self.points.shape[1]}], got {list(queries.shape)}")
        proj = queries @ self.direction
        # The slack covers rounding in the two projections (|x| * eps each).
        scale = max(1.0, float(np.abs(self._sorted).max(initial=0.0)), float(np.abs(proj).max(initial=0.0)))
        width = self.atol + 8 * np.finfo(np.float64).eps * scale
        lo = np.searchsorted(self._sorted, proj - width, side="left")
        hi = np.searchsorted(self._sorted, proj + width, side="right")
        found = np.full(len(queries), -1, dtype=np.int64)
        hits = np.zeros(len(queries), dtype=np.int64)
        for offset in range(int((hi - lo).max(initial=0))):
            rows = np.nonzero(lo + offset < hi)[0]
            cand = self._order[lo[rows] + offset]
            dist = np.linalg.norm(self.points[cand] - queries[rows], axis=1)
            close = dist <= self.atol
            found[rows[close]] = cand[close]
            hits[rows[close]] += 1
        return found, hits

    def _deviation(self, queries: np.ndarray) -> tuple[float, bool]:
        """Largest distance from a query to its nearest point, and whether it is exact.

        Exact (brute force in chunks) while the work fits ``_REPORT_BUDGET``; otherwise the largest
        deviation over a subset of the queries, which is a lower bound.
        """
        exact = len(queries) * len(self.points) <= _REPORT_BUDGET
        if not exact:
            queries = queries[: max(1, _REPORT_BUDGET // len(self.points))]
        chunk = max(1, 2**22 // len(self.points))
        worst = 0.0
        for start in range(0, len(queries), chunk):
            diff = queries[start : start + chunk, None, :] - self.points[None]
            worst = max(worst, float(np.sqrt((diff**2).sum(-1)).min(1).max()))
        return worst, exact

    def permutation(self, matrix: np.ndarray) -> np.ndarray:
        """int64 ``[P]`` with ``points[perm[i]] == matrix @ points[i]`` (within ``atol``).

        Raises:
            ValueError: if ``matrix`` is not ``[d, d]`` or the points are not closed under it.
        """
        matrix = np.asarray(matrix, dtype=np.float64)
        d = self.points.shape[1]
        if matrix.shape != (d, d):
            raise ValueError(f"expected a [{d}, {d}] matrix for {d}-dimensional points, got {list(matrix.shape)}")
        perm = self.find(self.points @ matrix.T)
        self._check_bijective(perm)
        return perm

    def maps_onto_itself(self, matrix: np.ndarray) -> bool:
        """Whether ``matrix [d, d]`` permutes the points (within ``atol``); no error when it does not."""
        found, hits = self._match(self.points @ np.asarray(matrix, dtype=np.float64).T)
        return bool(np.all(hits == 1)) and len(np.unique(found)) == len(found)

    @staticmethod
    def _check_bijective(perm: np.ndarray) -> None:
        # Distinct points have distinct images under an invertible matrix; a singular one can merge them.
        if len(np.unique(perm)) != len(perm):
            raise ValueError("matrix maps several points onto one point; it is not a permutation of the point set")


def point_permutation(points: np.ndarray, matrix: np.ndarray, atol: float = 1e-9) -> np.ndarray:
    """The permutation of ``points [P, d]`` induced by ``matrix [d, d]``.

    Returns int64 ``perm [P]`` with ``points[perm[i]] == matrix @ points[i]`` within Euclidean
    distance ``atol``: ``perm`` maps the index of a point to the index of its image.

    Raises:
        ValueError: if the point set is not closed under ``matrix`` within ``atol`` (the message
            gives the max deviation), has near-duplicate points, or shapes do not fit.
    """
    return PointIndex(points, atol).permutation(matrix)


def permutations_for(points: np.ndarray, matrices: np.ndarray, atol: float = 1e-9) -> np.ndarray:
    """int64 ``[G, P]``: row ``g`` is :func:`point_permutation` of ``points`` under ``matrices[g]``."""
    index = PointIndex(points, atol)
    matrices = np.asarray(matrices, dtype=np.float64)
    d = index.points.shape[1]
    if matrices.ndim != 3 or matrices.shape[1:] != (d, d):
        raise ValueError(f"expected matrices of shape [G, {d}, {d}], got {list(matrices.shape)}")
    if len(matrices) == 0:
        return np.zeros((0, len(index)), dtype=np.int64)
    return np.stack([index.permutation(m) for m in matrices])


def fibonacci_sphere(n: int) -> np.ndarray:
    """``[n, 3]`` float64 nearly uniform unit vectors on a golden-angle spiral (deterministic)."""
    if n < 1:
        raise ValueError(f"expected a positive number of points, got {n}")
    k = np.arange(n, dtype=np.float64) + 0.5
    z = 1.0 - 2.0 * k / n
    phi = k * np.pi * (3.0 - np.sqrt(5.0))
    s = np.sqrt(np.clip(1.0 - z * z, 0.0, None))
    return np.stack([s * np.cos(phi), s * np.sin(phi), z], axis=-1)
