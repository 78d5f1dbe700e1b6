"""Hexagonal lattices, hexagonal patches and the D6-patchified grid of the O(2) seed.

Pixel lattice: ``i * a1 + j * a2`` with ``a1 = (1, 0)``, ``a2 = (1/2, sqrt3/2)`` (integer
"lattice coordinates" ``(i, j)``). It is closed under D6: the rotation ``r = R(2 pi / 6)`` and
the reflection ``t = diag(1, -1)``.

Point order ("raster order", as for :func:`eqvit.geometry.square_grid`): rows from the top
(largest ``y``, i.e. largest ``j``) to the bottom, and left to right (increasing ``x``, i.e.
increasing ``i``) within a row. Both :func:`hexagon_points` and ``HexPatchGrid.points`` /
``HexPatchGrid.patch_centers`` use it.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from eqvit.geometry.points import PointIndex

__all__ = ["HEX_BASIS", "HexPatchGrid", "hexagon_lattice_coords", "hexagon_points"]

#: Rows are the pixel-lattice basis vectors a1 = (1, 0) and a2 = (1/2, sqrt3/2).
HEX_BASIS = np.array([[1.0, 0.0], [0.5, np.sqrt(3.0) / 2.0]])
HEX_BASIS.flags.writeable = False


def _check_side(name: str, n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"expected {name} to be a positive integer, got {n!r}")
    return int(n)


def _raster_order(coords: np.ndarray) -> np.ndarray:
    """Indices sorting integer lattice coordinates ``(i, j)`` into raster order."""
    return np.lexsort((coords[:, 0], -coords[:, 1]))


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.flags.writeable = False
    return arr


def hexagon_lattice_coords(n_side: int) -> np.ndarray:
    """int64 ``[P, 2]`` lattice coordinates ``(i, j)`` of :func:`hexagon_points` (same order).

    The hexagon with ``n_side`` points per side is ``max(|i|, |j|, |i + j|) <= n_side - 1``.
    """
    r = _check_side("n_side", n_side) - 1
    i, j = np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1), indexing="ij")
    coords = np.stack([i.ravel(), j.ravel()], 1).astype(np.int64)
    coords = coords[np.abs(coords.sum(1)) <= r]
    return coords[_raster_order(coords)]


def hexagon_points(n_side: int) -> np.ndarray:
    """``[P, 2]`` float64 lattice points in the regular hexagon with ``n_side`` points per side.

    Centred at the origin, corners at ``(n_side - 1) * R(k pi / 3) a1``; ``P = 3 n (n - 1) + 1``
    (217 for ``n = 9``); raster order (top row first, left to right). Closed under D6.
    """
    return hexagon_lattice_coords(n_side) @ HEX_BASIS


class HexPatchGrid:
    """The D6-patchified hexagonal grid ``H0 = U + H`` (Definition 3, Appendix F of the O(2) seed).

    ``U`` (the base patch) is :func:`hexagon_points` ``(n_pixel_side)`` on the pixel lattice,
    ``K = 3 n2 (n2 - 1) + 1`` pixels. ``H`` (the patch centres) is :func:`hexagon_points`
    ``(n_patch_side)`` mapped by the linear map ``a1 -> s (a1 + a2)``, ``a2 -> s (2 a2 - a1)``,
    i.e. scaled by ``s sqrt3`` and rotated by 30 degrees, with the integer ``s = spacing``
    (default ``n_pixel_side - 1``). That image is a sublattice of the pixel lattice, so every
    pixel of every patch lies on one common pixel lattice, and it is closed under D6 (a hexagonal
    lattice rotated by 30 degrees still has the x-axis as a mirror line); hence so is
    ``H0 = U + H``.

    With the default spacing, neighbouring patches are hexagons of radius ``s`` whose centres are
    ``s sqrt3`` apart across an edge: they share that edge (``n2`` pixels), and three patches
    share a corner, exactly the overlapping patches of the seed's Fig. 2. For ``N1 = N2 = 9``
    this gives 217 patches of 217 pixels and 42,073 distinct pixels, as in the seed.

    Args:
        n_patch_side: patch centres per side of the hexagon of patches (N1).
        n_pixel_side: pixels per side of each hexagonal patch (N2).
        spacing: positive integer ``s``; centre-to-centre distance is ``s * sqrt3`` pixels.
            ``s = n_pixel_side - 1`` (default) makes patches share edges; larger ``s`` leaves gaps
            or separates them, smaller ``s`` increases the overlap.

    Attributes (read-only numpy arrays):
        points: ``[P, 2]`` float64, the union of all patch pixels (the domain H0), raster order.
        lattice_coords: ``[P, 2]`` int64 pixel-lattice coordinates of ``points``.
        patch_centers: ``[M, 2]`` float64, raster order; ``M = 3 n1 (n1 - 1) + 1``.
        pixel_offsets: ``[K, 2]`` float64, ``hexagon_points(n_pixel_side)``.
        patch_index: ``[M, K]`` int64, ``points[patch_index[m, k]] == patch_centers[m] + pixel_offsets[k]``.

    For ``g`` in D6, pixel k of patch m maps to pixel ``offset_permutation(g)[k]`` of patch
    ``patch_permutation(g)[m]``:
    ``point_permutation(g)[patch_index[m, k]] == patch_index[patch_permutation(g)[m], offset_permutation(g)[k]]``.
    """

    def __init__(self, n_patch_side: int, n_pixel_side: int, spacing: int | None = None) -> None:
        self.n_patch_side = _check_side("n_patch_side", n_patch_side)
        self.n_pixel_side = _check_side("n_pixel_side", n_pixel_side)
        if spacing is None:
            spacing = max(self.n_pixel_side - 1, 1)
        self.spacing = _check_side("spacing", spacing)

        offsets = hexagon_lattice_coords(self.n_pixel_side)
        ci, cj = hexagon_lattice_coords(self.n_patch_side).T
        s = self.spacing
        centres = np.stack([s * (ci - cj), s * (ci + 2 * cj)], 1)
        pixels = (centres[:, None, :] + offsets[None, :, :]).reshape(-1, 2)
        # One integer key per pixel that sorts in raster order: rows top-down, then left to right.
        i, j = pixels.T
        width = int(i.max() - i.min()) + 1
        key = (j.max() - j) * width + (i - i.min())
        uniq, inverse = np.unique(key, return_inverse=True)
        coords = np.stack([uniq % width + i.min(), j.max() - uniq // width], 1).astype(np.int64)

        self.lattice_coords = _readonly(coords)
        self.points = _readonly(coords @ HEX_BASIS)
        self.patch_centers = _readonly(centres @ HEX_BASIS)
        self.pixel_offsets = _readonly(offsets @ HEX_BASIS)
        self.patch_index = _readonly(inverse.reshape(len(centres), len(offsets)).astype(np.int64))

    def __repr__(self) -> str:
        return (
            f"HexPatchGrid(n_patch_side={self.n_patch_side}, n_pixel_side={self.n_pixel_side}, "
            f"spacing={self.spacing}: {self.num_patches} patches x {self.patch_size} pixels, "
            f"{self.num_points} points)"
        )

    @property
    def num_points(self) -> int:
        return len(self.points)

    @property
    def num_patches(self) -> int:
        return len(self.patch_centers)

    @property
    def patch_size(self) -> int:
        return len(self.pixel_offsets)

    def patch_map(self) -> tuple[tuple[int, int], np.ndarray]:
        """``(shape, cells)``: the patch centres in axial coordinates, a ``(2r + 1) x (2r + 1)`` map
        (``r = n_patch_side - 1``) with patch ``m`` at the flat cell ``cells[m]``: row ``r - j`` (the rows from
        the top), column ``i + r`` for its patch-lattice coordinates ``(i, j)``. The cells outside the hexagon
        hold no patch."""
        r = self.n_patch_side - 1
        i, j = hexagon_lattice_coords(self.n_patch_side).T  # the order of patch_centers
        side = 2 * r + 1
        return (side, side), ((r - j) * side + (i + r)).astype(np.int64)

    @cached_property
    def _indices(self) -> tuple[PointIndex, PointIndex, PointIndex]:
        return PointIndex(self.points), PointIndex(self.patch_centers), PointIndex(self.pixel_offsets)

    def point_permutation(self, matrix: np.ndarray) -> np.ndarray:
        """int64 ``[P]`` with ``points[perm[i]] == matrix @ points[i]`` (ValueError if not closed)."""
        return self._indices[0].permutation(matrix)

    def patch_permutation(self, matrix: np.ndarray) -> np.ndarray:
        """int64 ``[M]`` with ``patch_centers[perm[m]] == matrix @ patch_centers[m]``."""
        return self._indices[1].permutation(matrix)

    def offset_permutation(self, matrix: np.ndarray) -> np.ndarray:
        """int64 ``[K]`` with ``pixel_offsets[perm[k]] == matrix @ pixel_offsets[k]``."""
        return self._indices[2].permutation(matrix)
