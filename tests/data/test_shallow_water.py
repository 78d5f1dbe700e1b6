"""Shallow-water data: exact synthesis at arbitrary points, solver pairs, caching.

The key test is that spherical-harmonic synthesis at the solver's own grid points reproduces
``solver.spec2grid``: both evaluate

    f(theta, phi) = sum_l sum_{m>=0} w_m Re(a_lm e^{i m phi}) Pbar_lm(cos theta),  w_0 = 1, w_m = 2,

the grid via torch-harmonics' Legendre matmul + irfft, ours via one real matrix built from
(theta, phi) of each point. A wrong normalisation, a missing factor 2 for m > 0, a sign of
sin(m phi) or a Condon-Shortley phase would each show up at O(1), not at 1e-9.
"""

import math

import pytest
import torch

from eqvit.data.shallow_water import (
    ShallowWaterConfig,
    ShallowWaterData,
    ShallowWaterStream,
    latlon_points,
    pack_real_coefficients,
    points_hash,
    real_sh_basis,
)
from eqvit.geometry import fibonacci_sphere


def rel_err_per_channel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """max |a - b| / max |b| over the spatial dims (last two), per leading index."""
    return (a - b).abs().amax(dim=(-2, -1)) / b.abs().amax(dim=(-2, -1))


@pytest.fixture(scope="module")
def data():
    return ShallowWaterData(ShallowWaterConfig(seed=7, stats_samples=8), points=torch.from_numpy(fibonacci_sphere(500)))


@pytest.fixture(scope="module")
def grid_basis(data):
    return real_sh_basis(latlon_points(data.config.nlat, data.config.nlon), data.lmax, data.mmax)


def test_config_defaults_follow_torch_harmonics_example():
    cfg = ShallowWaterConfig()
    assert (cfg.nlat, cfg.nlon, cfg.grid) == (64, 128, "equiangular")
    assert cfg.lmax == math.ceil(64 / 3) == 22  # PdeDataset: lmax = mmax = ceil(nlat / 3)
    assert cfg.dt_seconds == 3600.0 and cfg.dt_solver == 150.0  # train.py: dt = 3600, dt_solver = 150
    assert cfg.mach == 0.2 and cfg.spinup_steps == 0


def test_latlon_points_are_the_solver_grid(data):
    nlat, nlon = data.grid_shape
    pts = latlon_points(nlat, nlon).reshape(nlat, nlon, 3)
    torch.testing.assert_close(pts.norm(dim=-1), torch.ones(nlat, nlon, dtype=torch.float64))
    lat = torch.asin(pts[..., 2].clamp(-1, 1))
    torch.testing.assert_close(lat[:, 0], data.solver.lats, atol=1e-12, rtol=0)
    lon = torch.atan2(pts[nlat // 2, :, 1], pts[nlat // 2, :, 0]) % (2 * math.pi)
    torch.testing.assert_close(lon, data.solver.lons, atol=1e-12, rtol=0)


def test_random_initial_condition_is_the_solvers(data):
    # the solver draws from the global RNG; ours from a generator seeded the same way
    torch.manual_seed(3)
    ref = data.solver.random_initial_condition(mach=0.2)
    ours = data.random_initial_condition(1, torch.Generator().manual_seed(3))[0]
    torch.testing.assert_close(ours, ref, atol=0, rtol=1e-15)


def test_synthesis_at_grid_points_equals_spec2grid(data, grid_basis):
    """THE exactness test: synthesis at the grid points == solver.spec2grid (float64)."""
    spec = data.random_initial_condition(2, torch.Generator().manual_seed(11))
    spec = torch.cat((spec, data.step(spec[:1])))  # also a state after one hour of dynamics
    ref = data.solver.spec2grid(spec)  # [3, 3, nlat, nlon]
    ours = data.synthesize_points(spec, basis=grid_basis).reshape(ref.shape)
    assert rel_err_per_channel(ours, ref).max() < 1e-9


def test_synthesis_single_modes_including_imaginary_m0(data, grid_basis):
    # every (l, m) with a complex coefficient; Im a_l0 must be ignored exactly as irfft does
    spec = torch.zeros(data.lmax, data.mmax, data.lmax, data.mmax, dtype=torch.complex128)
    for l in range(data.lmax):
        for m in range(min(l, data.mmax - 1) + 1):
            spec[l, m, l, m] = 0.7 - 1.3j
    ref = data.solver.spec2grid(spec)
    ours = data.synthesize_points(spec, basis=grid_basis).reshape(ref.shape)
    mask = torch.tril(torch.ones(data.lmax, data.mmax, dtype=torch.bool))
    assert rel_err_per_channel(ours, ref)[mask].max() < 1e-9


def test_synthesis_at_z_rotated_grid_equals_rolled_grid(data):
    # rotating the points by one grid step about z: (theta, phi) -> (theta, phi + 2 pi / nlon),
    # so the value at column j is the grid's value at column j + 1, i.e. roll by -1
    nlat, nlon = data.grid_shape
    step = 2 * math.pi / nlon
    c, s = math.cos(step), math.sin(step)
    rz = torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    basis = real_sh_basis(latlon_points(nlat, nlon) @ rz.T, data.lmax, data.mmax)
    spec = data.random_initial_condition(2, torch.Generator().manual_seed(5))
    ref = torch.roll(data.solver.spec2grid(spec), shifts=-1, dims=-1)
    ours = data.synthesize_points(spec, basis=basis).reshape(ref.shape)
    assert rel_err_per_channel(ours, ref).max() < 1e-9


def test_pack_real_coefficients_layout():
    spec = torch.zeros(3, 3, dtype=torch.complex128)
    spec[2, 1] = 1 + 2j
    spec[1, 0] = 3 + 4j  # Im of m = 0 is dropped
    packed = pack_real_coefficients(spec)
    # (l, m) order: (0,0) (1,0) (1,1) (2,0) (2,1) (2,2), then Im for (1,1) (2,1) (2,2)
    assert packed.tolist() == [0, 3, 0, 0, 1, 0, 0, 2, 0]


def test_pairs_are_one_solver_hour(data):
    data.reseed(123)
    spec_x, spec_y = data.next_spectral_pairs(2)
    for i in range(2):
        ref = data.solver.timestep(spec_x[i], data.config.num_substeps)
        # batched einsums may round differently: compare relative to each channel's size
        assert rel_err_per_channel(spec_y[i], ref).max() < 1e-12
    # the same stream again gives fields of exactly these states, on both domains
    data.reseed(123)
    both = data.next_batch(2, domain="both")
    x_pts, _ = both["points"]
    x_grid, y_grid = both["grid"]
    assert x_pts.shape == (2, 3, 500) and x_pts.dtype == torch.float32
    assert y_grid.shape == (2, 3, 64, 128) and y_grid.dtype == torch.float32
    ref_grid = data.normalize(data.solver.spec2grid(spec_y), channel_dim=1)
    torch.testing.assert_close(y_grid, ref_grid.float(), atol=1e-5, rtol=1e-5)
    ref_pts = data.normalize(data.synthesize_points(spec_x), channel_dim=1)
    torch.testing.assert_close(x_pts, ref_pts.float(), atol=1e-5, rtol=1e-5)
    # the target differs from the input (the dynamics did something)
    assert (y_grid - x_grid).abs().mean() > 1e-3


def test_statistics_are_area_weighted_moments(data):
    from eqvit.train.metrics import latlon_quadrature_weights

    spec = data.random_initial_condition(4, torch.Generator().manual_seed(2))
    mean, std = data.spectral_moments(spec)
    grid = data.solver.spec2grid(spec)  # [4, 3, nlat, nlon]
    w = latlon_quadrature_weights(*data.grid_shape)
    gmean = (grid * w).sum(dim=(-2, -1)).mean(0) / (4 * math.pi)
    gsq = (grid**2 * w).sum(dim=(-2, -1)).mean(0) / (4 * math.pi)
    torch.testing.assert_close(mean, gmean, rtol=1e-9, atol=1e-12 * std.max().item())
    torch.testing.assert_close(std, (gsq - gmean**2).sqrt(), rtol=1e-7, atol=0)
    m, s = data.stats
    assert m.shape == (3,) and s.shape == (3,) and bool((s > 0).all())
    assert 9.0e4 < m[0] < 1.1e5  # geopotential g * havg ~ 9.8e4 m^2/s^2


def test_normalization_round_trip(data):
    x = torch.randn(2, 3, 500, dtype=torch.float64) * 100
    torch.testing.assert_close(data.denormalize(data.normalize(x)), x, rtol=1e-12, atol=1e-10)
    g = torch.randn(3, 4, 3, 8, 16, dtype=torch.float64)
    torch.testing.assert_close(data.normalize(data.denormalize(g, channel_dim=2), channel_dim=2), g)
    # normalised training fields are O(1)
    xg, _ = data.next_batch(2, domain="grid")
    assert 0.1 < xg.std().item() < 10


def test_trajectory_pool_yields_consecutive_pairs():
    cfg = ShallowWaterConfig(seed=1, stats_samples=2, steps_per_trajectory=3)
    d = ShallowWaterData(cfg)
    _, y1 = d.next_spectral_pairs(2)  # ages after: [1, 2]
    x2, y2 = d.next_spectral_pairs(2)  # ages after: [2, 3 -> re-seeded]
    x3, _ = d.next_spectral_pairs(2)
    assert torch.equal(x2, y1)
    assert torch.equal(x3[0], y2[0])
    assert not torch.allclose(x3[1], y2[1])


def test_validation_set_cached_and_deterministic(tmp_path, data):
    val = data.validation_set(3, seed=42, cache_dir=tmp_path, chunk_size=2)
    assert val.path is not None and val.path.exists()
    name = val.path.name
    assert data.config.key() in name and "seed42" in name and "_n3_" in name and points_hash(data.points) in name
    assert val.x_points.shape == (3, 3, 500) and val.y_grid.shape == (3, 3, 64, 128)
    loaded = data.validation_set(3, seed=42, cache_dir=tmp_path, chunk_size=2)
    fresh = ShallowWaterData(data.config, points=data.points).validation_set(3, seed=42, chunk_size=2)
    for other in (loaded, fresh):
        for field in ("spec_x", "spec_y", "x_grid", "y_grid", "x_points", "y_points", "mean", "std"):
            assert torch.equal(getattr(other, field), getattr(val, field)), field
    assert fresh.path is None
    batches = list(val.batches(2, domain="points"))
    assert [b[0].shape[0] for b in batches] == [2, 1]
    other_seed = data.validation_set(3, seed=43, chunk_size=2)
    assert not torch.equal(other_seed.spec_x, val.spec_x)


def test_stream_with_dataloader():
    d = ShallowWaterData(ShallowWaterConfig(seed=3, stats_samples=2))
    loader = torch.utils.data.DataLoader(ShallowWaterStream(d, batch_size=2, num_batches=1), batch_size=None)
    ((x, y),) = list(loader)
    assert x.shape == y.shape == (2, 3, 64, 128)


def test_bad_inputs_raise_value_error(data):
    with pytest.raises(ValueError, match=r"\[V, 3\].*got \[10, 2\]"):
        ShallowWaterData(ShallowWaterConfig(), points=torch.randn(10, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="unit vectors"):
        real_sh_basis(2 * torch.from_numpy(fibonacci_sphere(10)), 4)
    with pytest.raises(ValueError, match="unknown domain"):
        data.next_batch(1, domain="mesh")
    with pytest.raises(ValueError, match=r"\[\.\.\., 3, 22, 22\]"):
        data.step(torch.zeros(2, 3, 10, 10, dtype=torch.complex128))
    with pytest.raises(ValueError, match="3 channels"):
        data.normalize(torch.zeros(2, 4, 5))
    with pytest.raises(ValueError, match="unknown grid"):
        ShallowWaterConfig(grid="healpix")
    with pytest.raises(ValueError, match="lmax"):
        ShallowWaterConfig(lmax=100)
    with pytest.raises(ValueError, match="needs a point set"):
        ShallowWaterData(ShallowWaterConfig(stats_samples=2)).next_batch(1, domain="points")
