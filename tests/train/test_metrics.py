"""Quadrature-weighted sphere metrics."""

import math

import pytest
import torch

from eqvit.geometry import fibonacci_sphere
from eqvit.train.metrics import (
    SphereErrorMap,
    grid_latitudes,
    latlon_quadrature_weights,
    lp_error,
    polar_error_ratio,
    relative_lp_error,
    weighted_mean,
)

NLAT, NLON = 16, 32


@pytest.fixture(scope="module")
def grid_w():
    return latlon_quadrature_weights(NLAT, NLON)


@pytest.fixture(scope="module")
def points():
    pts = torch.from_numpy(fibonacci_sphere(400))
    return pts, torch.full((400,), 4 * math.pi / 400, dtype=torch.float64)  # equal-area


@pytest.mark.parametrize("grid", ["equiangular", "legendre-gauss"])
def test_grid_weights_sum_to_4pi(grid):
    w = latlon_quadrature_weights(NLAT, NLON, grid=grid)
    assert w.shape == (NLAT, NLON) and w.dtype == torch.float64
    assert abs(w.sum().item() - 4 * math.pi) < 1e-12
    assert bool((w >= 0).all())


def test_grid_weights_match_torch_harmonics_quadrature(grid_w):
    from torch_harmonics import QuadratureS2

    quad = QuadratureS2((NLAT, NLON), grid="equiangular")
    f = torch.randn(2, 1, NLAT, NLON, dtype=torch.float64)
    torch.testing.assert_close(quad(f.float()).double(), (f * grid_w).sum(dim=(-2, -1)), rtol=1e-5, atol=1e-5)


def test_weighted_mean_of_constant_and_of_z_squared(grid_w, points):
    const = torch.full((2, 3, NLAT, NLON), 2.5, dtype=torch.float64)
    torch.testing.assert_close(weighted_mean(const, grid_w), torch.full((2, 3), 2.5, dtype=torch.float64))
    _, pw = points
    torch.testing.assert_close(
        weighted_mean(torch.full((4, 400), -1.5, dtype=torch.float64), pw),
        torch.full((4,), -1.5, dtype=torch.float64),
    )
    # mean of z^2 over the sphere is 1/3; Clenshaw-Curtis integrates it exactly
    z = torch.cos(math.pi / 2 - grid_latitudes(NLAT)).reshape(NLAT, 1).expand(NLAT, NLON)
    assert abs(weighted_mean(z**2, grid_w).item() - 1 / 3) < 1e-12
    # [nlat, 1] weights give the same result as [nlat, nlon]
    torch.testing.assert_close(weighted_mean(z**2, grid_w[:, :1]), weighted_mean(z**2, grid_w))


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("domain", ["grid", "points"])
def test_relative_lp_error_values(p, domain, grid_w, points):
    if domain == "grid":
        target, w = torch.randn(3, 2, NLAT, NLON, dtype=torch.float64), grid_w
    else:
        target, w = torch.randn(3, 2, 400, dtype=torch.float64), points[1]
    assert relative_lp_error(target.clone(), target, w, p=p).item() == 0.0
    torch.testing.assert_close(
        relative_lp_error(2 * target, target, w, p=p, reduction="none"), torch.ones(3, 2, dtype=torch.float64)
    )
    # against the formula written out
    pred = target + 0.1 * torch.randn_like(target)
    k = w.ndim
    dims = tuple(range(-k, 0))
    ref = ((pred - target).abs() ** p * w).sum(dims) ** (1 / p) / ((target.abs() ** p * w).sum(dims)) ** (1 / p)
    torch.testing.assert_close(relative_lp_error(pred, target, w, p=p, reduction="none"), ref)
    torch.testing.assert_close(relative_lp_error(pred, target, w, p=p, reduction="channel"), ref.mean(0))
    torch.testing.assert_close(relative_lp_error(pred, target, w, p=p, dims=dims), ref.mean())


@pytest.mark.parametrize("grid", ["equiangular", "legendre-gauss"])
def test_lp_error_is_torch_harmonics_l1_and_l2_loss(grid):
    """The seed's l1 / l2: torch-harmonics' L1LossS2 / L2LossS2 (weights normalised to 1, mean over [B, C])."""
    from torch_harmonics.examples.losses import L1LossS2, L2LossS2

    w = latlon_quadrature_weights(NLAT, NLON, grid=grid)
    target = torch.randn(3, 2, NLAT, NLON, dtype=torch.float64)
    pred = target + 0.1 * torch.randn_like(target)
    th_l1 = L1LossS2(NLAT, NLON, grid=grid).double()(pred, target)
    th_l2 = L2LossS2(NLAT, NLON, grid=grid).double()(pred, target)
    torch.testing.assert_close(lp_error(pred, target, w, p=1), th_l1, rtol=1e-6, atol=0)
    torch.testing.assert_close(lp_error(pred, target, w, p=2), th_l2, rtol=1e-6, atol=0)
    # the weights' scale does not matter; [nlat, 1] weights are the same
    torch.testing.assert_close(lp_error(pred, target, 7.0 * w[:, :1], p=2), th_l2, rtol=1e-6, atol=0)


@pytest.mark.parametrize("p", [1, 2])
def test_relative_error_is_the_error_over_the_norm_of_the_target(p, points):
    """rel_Lp = Lp(pred - target) / Lp(target), per sample and channel; for a Gaussian field the mean
    absolute value is sqrt(2 / pi) = 0.80 of the root mean square, which is why rel_L1 ~ rel_L2 while
    L1 ~ 0.8 L2 when both the error and the target are Gaussian-like."""
    _, w = points
    target = torch.randn(4, 3, 400, dtype=torch.float64)
    pred = target + 0.1 * torch.randn_like(target)
    ratio = lp_error(pred, target, w, p=p, reduction="none") / lp_error(
        torch.zeros_like(target), target, w, p=p, reduction="none"
    )
    torch.testing.assert_close(relative_lp_error(pred, target, w, p=p, reduction="none"), ratio)
    big = torch.randn(2, 1, 40_000, dtype=torch.float64)
    flat = torch.ones(40_000, dtype=torch.float64)
    zero = torch.zeros_like(big)
    assert lp_error(zero, big, flat, p=1).item() / lp_error(zero, big, flat, p=2).item() == pytest.approx(
        math.sqrt(2 / math.pi), abs=0.01
    )


def test_relative_lp_error_is_differentiable(grid_w):
    target = torch.randn(2, 3, NLAT, NLON)
    pred = (target + 0.1 * torch.randn_like(target)).requires_grad_()
    relative_lp_error(pred, target, grid_w.float(), p=2).backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0


def test_sphere_error_map(points):
    m = SphereErrorMap()
    a, b = torch.randn(2, 3, 400), torch.randn(3, 3, 400)
    m.update(a, torch.zeros_like(a))
    m.update(b, torch.zeros_like(b))
    expected = torch.cat((a, b)).abs().double().mean(dim=(0, 1))
    torch.testing.assert_close(m.compute(), expected)
    sq = SphereErrorMap(kind="squared", per_channel=True)
    g = torch.randn(2, 3, NLAT, NLON)
    sq.update(g, torch.zeros_like(g))
    assert sq.compute().shape == (3, NLAT, NLON)
    torch.testing.assert_close(sq.compute(), (g.double() ** 2).mean(0))
    with pytest.raises(ValueError, match=r"expected samples of shape \[3, 400\].*got \[3, 401\]"):
        m.update(torch.zeros(1, 3, 401), torch.zeros(1, 3, 401))
    with pytest.raises(ValueError, match="at least one update"):
        SphereErrorMap().compute()


def test_polar_error_ratio(grid_w, points):
    pts, pw = points
    lat_pts = torch.asin(pts[:, 2])
    # uniform error -> 1 on both point sets and grids, whichever way the latitudes come
    assert abs(polar_error_ratio(torch.full((400,), 0.3, dtype=torch.float64), pts, pw).item() - 1) < 1e-12
    uniform = torch.full((NLAT, NLON), 0.3, dtype=torch.float64)
    assert abs(polar_error_ratio(uniform, grid_latitudes(NLAT), grid_w).item() - 1) < 1e-12
    assert abs(polar_error_ratio(uniform, grid_latitudes(NLAT).reshape(NLAT, 1), grid_w[:, :1]).item() - 1) < 1e-12
    # error concentrated at the poles -> > 1; at the equator -> < 1
    polar_pts = (lat_pts.abs() > math.radians(70)).double() + 0.01
    assert polar_error_ratio(polar_pts, pts, pw).item() > 2
    assert polar_error_ratio(polar_pts, lat_pts, pw).item() == polar_error_ratio(polar_pts, pts, pw).item()
    lat_g = grid_latitudes(NLAT).reshape(NLAT, 1).expand(NLAT, NLON)
    polar_g = torch.sin(lat_g) ** 4
    assert polar_error_ratio(polar_g, grid_latitudes(NLAT), grid_w).item() > 1
    assert polar_error_ratio(torch.cos(lat_g) ** 4, grid_latitudes(NLAT), grid_w).item() < 1


def test_mismatched_shapes_raise_value_error(grid_w, points):
    pts, pw = points
    x = torch.zeros(2, 3, NLAT, NLON)
    with pytest.raises(ValueError, match=r"same shape.*\[2, 3, 16, 32\] and \[2, 3, 16, 31\]"):
        relative_lp_error(x, torch.zeros(2, 3, NLAT, NLON - 1), grid_w)
    with pytest.raises(ValueError, match=r"expected weights of shape \[16, 32\] or \[16, 1\].*got \[16, 31\]"):
        relative_lp_error(x, x, grid_w[:, :-1])
    with pytest.raises(ValueError, match=r"expected weights of shape \[401\].*got \[400\]"):
        relative_lp_error(torch.zeros(2, 401), torch.zeros(2, 401), pw)
    with pytest.raises(ValueError, match="unknown reduction"):
        relative_lp_error(x, x, grid_w, reduction="sum")
    with pytest.raises(ValueError, match="dims"):
        relative_lp_error(x, x, grid_w, dims=(-1,))
    with pytest.raises(ValueError, match=r"points \[400, 3\] or latitudes \[400\].*got \[399, 3\]"):
        polar_error_ratio(torch.ones(400), pts[:-1], pw)
    with pytest.raises(ValueError, match="weights with 2 dims"):
        polar_error_ratio(torch.ones(NLAT, NLON), grid_latitudes(NLAT), pw)
    with pytest.raises(ValueError, match="poleward"):
        polar_error_ratio(torch.ones(400), pts, pw, polar_lat_deg=90)
