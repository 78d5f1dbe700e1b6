"""Pure geometry (numpy float64, no learning): icospheres, latitude-longitude, hexagonal and square grids, and how an
orthogonal matrix permutes their points.

Permutation convention everywhere: ``points[perm[i]] == matrix @ points[i]``.
"""

from eqvit.geometry.hexagonal import HEX_BASIS, HexPatchGrid, hexagon_lattice_coords, hexagon_points
from eqvit.geometry.icosphere import Icosphere, icosphere, spherical_triangle_area
from eqvit.geometry.latlon import LATLON_GRIDS, latlon_points
from eqvit.geometry.points import PointIndex, fibonacci_sphere, permutations_for, point_permutation
from eqvit.geometry.square import square_grid

__all__ = [
    "HEX_BASIS",
    "LATLON_GRIDS",
    "HexPatchGrid",
    "Icosphere",
    "PointIndex",
    "fibonacci_sphere",
    "hexagon_lattice_coords",
    "hexagon_points",
    "icosphere",
    "latlon_points",
    "permutations_for",
    "point_permutation",
    "spherical_triangle_area",
    "square_grid",
]
