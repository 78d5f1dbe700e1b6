"""torch-harmonics' latitude-longitude grids as points on the unit sphere."""

from __future__ import annotations

import torch

__all__ = ["LATLON_GRIDS", "latlon_points"]

LATLON_GRIDS = ("equiangular", "legendre-gauss", "lobatto")


def latlon_points(nlat: int, nlon: int, grid: str = "equiangular") -> torch.Tensor:
    """Unit vectors ``[nlat * nlon, 3]`` (float64) of torch-harmonics' lat-lon grid.

    Row ``i * nlon + j`` is grid point ``(i, j)``: colatitude ``theta_i`` from
    ``torch_harmonics.quadrature.precompute_latitudes`` (``theta_0 = 0`` is the north pole,
    as in ``ShallowWaterSolver.lats``), longitude ``phi_j = 2 pi j / nlon``.
    """
    from torch_harmonics.quadrature import precompute_latitudes, precompute_longitudes

    if grid not in LATLON_GRIDS:
        raise ValueError(f"unknown grid {grid!r}; expected one of {list(LATLON_GRIDS)}")
    theta, _ = precompute_latitudes(nlat, grid=grid)
    phi = precompute_longitudes(nlon)
    theta = theta.to(torch.float64).reshape(nlat, 1)
    phi = phi.to(torch.float64).reshape(1, nlon)
    sin_t = torch.sin(theta)
    xyz = torch.stack((sin_t * torch.cos(phi), sin_t * torch.sin(phi), torch.cos(theta).expand(nlat, nlon)), dim=-1)
    return xyz.reshape(nlat * nlon, 3).contiguous()
