"""Shallow-water equations on the rotating sphere, evaluated exactly on any point set.

The dynamics are those of torch-harmonics' ``PdeDataset`` example (the benchmark of the
S2Transformer paper and of Sec. 4.1 of the SO(3)-RoPE paper):

* one :class:`torch_harmonics.examples.ShallowWaterSolver` on the 64 x 128 equiangular
  grid, triangular truncation ``lmax = mmax = ceil(nlat / 3)`` (= 22);
* random initial conditions ``random_initial_condition(mach=0.2)``, no spin-up;
* one sample is the pair (state at t, state at t + 1 h); the hour is integrated with the
  solver's third-order Adams-Bashforth scheme in 24 sub-steps of 150 s (the example's
  ``dt = 3600``, ``dt_solver = 150``), restarted (forward Euler first) every hour exactly as
  ``solver.timestep(uspec, 24)`` does;
* the state has the example's three channels, in physical units before normalisation:
  geopotential ``phi = g h`` [m^2/s^2], relative vorticity [1/s], divergence [1/s].

What this module adds is *exact* evaluation at arbitrary points. The solver's state is a set
of spherical-harmonic coefficients ``a_lm`` (``[..., 3, lmax, mmax]`` complex, orthonormal
"ortho" harmonics without Condon-Shortley phase, only ``m >= 0`` stored). Its grid output is
the real inverse transform

    f(theta, phi) = sum_l sum_{m >= 0} w_m Re(a_lm e^{i m phi}) Pbar_lm(cos theta),
    w_0 = 1, w_m = 2 for m > 0,  (imaginary part of a_l0 ignored, as irfft does)

and we evaluate the same sum at any unit vector ``p`` (``theta = acos z``,
``phi = atan2(y, x)``) with torch-harmonics' own ``legpoly``. The sum is written as one real
matrix ``basis [K, V]`` acting on the packed real coefficient vector ``[..., K]``, so
synthesis on 10,242 icosphere vertices is one matmul. Evaluated at the solver's own grid
points it reproduces ``solver.spec2grid`` to rounding error; the tests check that.

Departures from the example, on purpose:

* the solver runs in float64 (the example casts it to float32) and the pairs are generated
  in batches with the solver's own scheme generalised over leading batch dimensions
  (``ShallowWaterSolver.timestep`` handles a single state only); the tests compare it
  against ``solver.timestep``;
* random numbers come from a private ``torch.Generator`` (seeded from the config), not the
  global RNG, so streams are reproducible and independent of the model's RNG use;
* the normalisation statistics are area-weighted (exact spherical mean and variance from the
  coefficients, over ``stats_samples`` input states), not the unweighted grid mean of one
  sample, so that the icosphere and the lat-lon grid are normalised identically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from eqvit.data.cache import CorruptCacheError, cached, digest
from eqvit.geometry.latlon import LATLON_GRIDS, latlon_points
from eqvit.utils import atomic_write, check_memory, format_bytes

__all__ = [
    "ShallowWaterConfig",
    "ShallowWaterData",
    "ShallowWaterStream",
    "ValidationSet",
    "latlon_points",
    "pack_real_coefficients",
    "points_hash",
    "real_sh_basis",
]

CHANNELS = ("geopotential", "vorticity", "divergence")
_DOMAINS = ("points", "grid", "both")


# --------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShallowWaterConfig:
    """Shallow-water data generation, defaults as torch-harmonics' ``PdeDataset`` example.

    Attributes:
        nlat, nlon: the solver's lat-lon grid (also the S2Transformer baseline's input grid).
        grid: latitude quadrature of the solver grid, ``"equiangular"`` (poles included).
        lmax: spectral truncation (degree and order, exclusive); ``None`` -> ``ceil(nlat/3)``.
        dt_hours: time between input and target.
        num_substeps: solver steps per ``dt`` (the example: 3600 s / 150 s = 24).
        spinup_steps: ``dt`` steps integrated from the random initial condition before the
            first input (the example: 0).
        steps_per_trajectory: consecutive pairs taken from one trajectory before it is
            re-seeded (1 = a fresh initial condition for every pair, as the example does).
        mach: Mach number of the random initial velocity field (the example: 0.2).
        seed: seed of the training stream and of the normalisation sample.
        stats_samples: number of input states the normalisation statistics are computed on.
        num_threads: torch CPU threads used while generating (the solver's transforms are
            many tiny matmuls, for which threading only costs); ``None`` leaves torch's setting.
    """

    nlat: int = 64
    nlon: int = 128
    grid: str = "equiangular"
    lmax: int | None = None
    dt_hours: float = 1.0
    num_substeps: int = 24
    spinup_steps: int = 0
    steps_per_trajectory: int = 1
    mach: float = 0.2
    seed: int = 0
    stats_samples: int = 32
    num_threads: int | None = 1

    def __post_init__(self):
        if self.grid not in LATLON_GRIDS:
            raise ValueError(f"unknown grid {self.grid!r}; expected one of {list(LATLON_GRIDS)}")
        for name in ("nlat", "nlon", "num_substeps", "steps_per_trajectory", "stats_samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"expected {name} to be a positive int, got {value!r}")
        if self.nlat < 3 or self.nlon < 4:
            raise ValueError(f"expected nlat >= 3 and nlon >= 4, got nlat={self.nlat}, nlon={self.nlon}")
        if not isinstance(self.spinup_steps, int) or self.spinup_steps < 0:
            raise ValueError(f"expected spinup_steps to be an int >= 0, got {self.spinup_steps!r}")
        if not self.dt_hours > 0:
            raise ValueError(f"expected dt_hours > 0, got {self.dt_hours!r}")
        if not self.mach > 0:
            raise ValueError(f"expected mach > 0, got {self.mach!r}")
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise ValueError(f"expected num_threads to be None or a positive int, got {self.num_threads!r}")
        lmax = math.ceil(self.nlat / 3) if self.lmax is None else self.lmax
        if not isinstance(lmax, int) or not 1 <= lmax <= min(self.nlat, self.nlon // 2 + 1):
            raise ValueError(
                f"expected 1 <= lmax <= min(nlat, nlon // 2 + 1) = {min(self.nlat, self.nlon // 2 + 1)}, "
                f"got lmax={lmax!r}"
            )
        object.__setattr__(self, "lmax", lmax)

    @property
    def dt_seconds(self) -> float:
        return float(self.dt_hours) * 3600.0

    @property
    def dt_solver(self) -> float:
        """Solver step in seconds (150 s by default)."""
        return self.dt_seconds / self.num_substeps

    def key(self) -> str:
        """Short hash of everything that determines the generated data (not ``num_threads``)."""
        fields = dataclasses.asdict(self)
        fields.pop("num_threads")
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------
# geometry and spherical-harmonic synthesis
# --------------------------------------------------------------------------------------


def _check_points(points: torch.Tensor, name: str = "points") -> torch.Tensor:
    if not isinstance(points, torch.Tensor):
        raise TypeError(f"expected {name} as a torch.Tensor [V, 3], got {type(points).__name__}")
    if points.ndim != 2 or points.shape[1] != 3 or points.shape[0] < 1:
        raise ValueError(f"expected {name} of shape [V, 3] (unit vectors), got {list(points.shape)}")
    points = points.detach().to(torch.float64)
    if not torch.isfinite(points).all():
        raise ValueError(f"expected finite {name}, got NaN or inf")
    norm_err = (points.norm(dim=1) - 1.0).abs().max().item()
    if norm_err > 1e-6:
        raise ValueError(f"expected {name} to be unit vectors, got norms off by up to {norm_err:.3g}")
    return points


def points_hash(points: torch.Tensor | None) -> str:
    """Short content hash of a point set (``"grid"`` for ``None``), used in cache file names."""
    if points is None:
        return "grid"
    arr = points.detach().to("cpu", torch.float64).contiguous().numpy()
    digest = hashlib.sha256(str(arr.shape).encode() + arr.tobytes()).hexdigest()
    return digest[:12]


def _tril_index(lmax: int, mmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(l, m) of the stored coefficients with ``m <= l``, l-major."""
    ls, ms = [], []
    for l in range(lmax):
        for m in range(min(l, mmax - 1) + 1):
            ls.append(l)
            ms.append(m)
    return torch.tensor(ls, dtype=torch.long), torch.tensor(ms, dtype=torch.long)


def pack_real_coefficients(spec: torch.Tensor) -> torch.Tensor:
    """Complex coefficients ``[..., lmax, mmax]`` -> real vector ``[..., K]``.

    Layout: ``Re a_lm`` for all ``m <= l`` (l-major), then ``Im a_lm`` for ``0 < m <= l``.
    ``Im a_l0`` is dropped (it never reaches the grid: ``irfft`` ignores it). Matches the rows
    of :func:`real_sh_basis`.
    """
    if not torch.is_complex(spec) or spec.ndim < 2:
        raise ValueError(f"expected complex coefficients [..., lmax, mmax], got {spec.dtype} {list(spec.shape)}")
    lmax, mmax = spec.shape[-2:]
    l_idx, m_idx = _tril_index(lmax, mmax)
    l_idx, m_idx = l_idx.to(spec.device), m_idx.to(spec.device)
    sel = spec[..., l_idx, m_idx]
    pos = m_idx > 0
    return torch.cat((sel.real, sel.imag[..., pos]), dim=-1)


def real_sh_basis(points: torch.Tensor, lmax: int, mmax: int | None = None) -> torch.Tensor:
    """Real synthesis matrix ``[K, V]`` (float64) such that ``pack_real_coefficients(a) @ basis``
    equals torch-harmonics' ``InverseRealSHT(norm="ortho", csphase=False)`` evaluated at ``points``.

    Rows: ``w_m Pbar_lm(cos theta) cos(m phi)`` for every ``m <= l``, then
    ``-2 Pbar_lm(cos theta) sin(m phi)`` for ``0 < m <= l`` (``w_0 = 1``, ``w_m = 2``: the real
    FFT's ``m > 0`` terms stand for ``+m`` and ``-m``). ``Pbar_lm`` is torch-harmonics'
    ``legpoly(..., norm="ortho", inverse=True, csphase=False)``, the solver's convention.
    """
    from torch_harmonics.legendre import legpoly

    points = _check_points(points)
    mmax = lmax if mmax is None else mmax
    z = points[:, 2].clamp(-1.0, 1.0)
    phi = torch.atan2(points[:, 1], points[:, 0])
    pct = legpoly(mmax, lmax, z, norm="ortho", inverse=True, csphase=False)  # [mmax, lmax, V]
    l_idx, m_idx = _tril_index(lmax, mmax)
    p_lm = pct[m_idx.to(pct.device), l_idx.to(pct.device)]  # [K0, V]
    mf = m_idx.to(torch.float64).to(points.device).unsqueeze(1)
    weight = torch.where(mf > 0, 2.0, 1.0)
    cos_rows = weight * p_lm * torch.cos(mf * phi)
    pos = m_idx > 0
    sin_rows = -2.0 * p_lm[pos] * torch.sin(mf[pos] * phi)
    return torch.cat((cos_rows, sin_rows), dim=0).contiguous()


# --------------------------------------------------------------------------------------
# batched solver stepping (the solver's own scheme, over leading batch dims)
# --------------------------------------------------------------------------------------


def _dudtspec(solver, uspec: torch.Tensor) -> torch.Tensor:
    """``ShallowWaterSolver.dudtspec`` for ``uspec [..., 3, lmax, mmax]`` (same operations)."""
    ugrid = solver.spec2grid(uspec)
    uvgrid = solver.getuv(uspec[..., 1:, :, :])
    tmpspec = solver.vrtdivspec(uvgrid * (ugrid[..., 1:2, :, :] + solver.coriolis))
    d_div = tmpspec[..., 0, :, :]
    d_vrt = -1 * tmpspec[..., 1, :, :]
    tmp = solver.vrtdivspec(uvgrid * ugrid[..., 0:1, :, :])
    d_phi = -1 * tmp[..., 1, :, :]
    energy = solver.grid2spec(ugrid[..., 0, :, :] + 0.5 * (uvgrid[..., 0, :, :] ** 2 + uvgrid[..., 1, :, :] ** 2))
    d_div = d_div - solver.lap * energy
    return torch.stack((d_phi, d_vrt, d_div), dim=-3)


def _timestep(solver, uspec: torch.Tensor, nsteps: int) -> torch.Tensor:
    """``ShallowWaterSolver.timestep`` for ``uspec [..., 3, lmax, mmax]``: AB3 with a forward
    Euler / AB2 start, implicit hyperdiffusion on vorticity and divergence."""
    dt = solver.dt
    d_new = d_now = d_old = None
    for it in range(nsteps):
        d_new = _dudtspec(solver, uspec)
        if it == 0:
            d_now = d_old = d_new
        elif it == 1:
            d_old = d_new
        uspec = uspec + dt * ((23.0 / 12.0) * d_new - (16.0 / 12.0) * d_now + (5.0 / 12.0) * d_old)
        uspec = torch.cat((uspec[..., :1, :, :], solver.hyperdiff * uspec[..., 1:, :, :]), dim=-3)
        d_old, d_now = d_now, d_new
    return uspec


@contextlib.contextmanager
def _torch_threads(n: int | None):
    old = torch.get_num_threads()
    if n is None or n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _derive_seed(seed: int, tag: str) -> int:
    digest = hashlib.sha256(f"eqvit.shallow_water:{tag}:{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# --------------------------------------------------------------------------------------
# validation set
# --------------------------------------------------------------------------------------


@dataclass
class ValidationSet:
    """A fixed set of pairs. Fields are normalised float32; ``spec_*`` are the exact states."""

    spec_x: torch.Tensor  # [N, 3, lmax, mmax] complex128
    spec_y: torch.Tensor
    x_grid: torch.Tensor  # [N, 3, nlat, nlon] float32
    y_grid: torch.Tensor
    x_points: torch.Tensor | None  # [N, 3, V] float32, None without a point set
    y_points: torch.Tensor | None
    mean: torch.Tensor  # [3] float64, physical units
    std: torch.Tensor
    path: Path | None = None

    def __len__(self) -> int:
        return self.spec_x.shape[0]

    def tensors(self, domain: str = "points") -> tuple[torch.Tensor, torch.Tensor]:
        if domain == "grid":
            return self.x_grid, self.y_grid
        if domain == "points":
            if self.x_points is None:
                raise ValueError("this validation set has no point-set fields (built without points)")
            return self.x_points, self.y_points
        raise ValueError(f"unknown domain {domain!r}; expected 'points' or 'grid'")

    def batches(self, batch_size: int, domain: str = "points") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Consecutive ``(x, y)`` batches in a fixed order (the last one may be smaller)."""
        x, y = self.tensors(domain)
        for start in range(0, len(self), batch_size):
            yield x[start : start + batch_size], y[start : start + batch_size]


_VALIDATION_KEYS = ("spec_x", "spec_y", "x_grid", "y_grid", "mean", "std")


def _tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    return digest((k, tensors[k].detach().cpu().numpy()) for k in sorted(tensors))


def _save_safetensors_atomic(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write ``tensors`` with ``metadata`` and their SHA-256 (``metadata["sha256"]``), atomically, with the umask's
    mode (:func:`eqvit.utils.atomic_write`)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    metadata = {**metadata, "sha256": _tensor_digest(tensors)}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def _load_safetensors_verified(path: Path, keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The tensors of a file :func:`_save_safetensors_atomic` wrote, checked against their recorded SHA-256;
    :class:`~eqvit.data.cache.CorruptCacheError` when the file is unreadable, lacks ``keys`` or does not match."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
            recorded = (fh.metadata() or {}).get("sha256")
    except (SafetensorError, OSError, ValueError) as err:
        raise CorruptCacheError(f"{type(err).__name__}: {err}") from None
    missing = [key for key in keys if key not in tensors]
    if missing or recorded is None:
        raise CorruptCacheError(f"it lacks {', '.join(missing or ['its checksum'])}")
    if _tensor_digest(tensors) != recorded:
        raise CorruptCacheError("its contents do not match the checksum stored with them")
    return tensors


# --------------------------------------------------------------------------------------
# the data source
# --------------------------------------------------------------------------------------


class ShallowWaterData:
    """Owns one ``ShallowWaterSolver`` and produces ``(x, y)`` pairs on a point set and/or
    the solver's lat-lon grid, from the same simulations.

    Args:
        config: :class:`ShallowWaterConfig` (defaults: the torch-harmonics example).
        points: optional unit vectors ``[V, 3]`` (e.g. ``icosphere(5).vertices``) at which the
            fields are synthesised exactly from the spectral state.
        device: where the solver, the basis and the outputs live.

    Example::

        data = ShallowWaterData(ShallowWaterConfig(seed=0), points=ico.vertices)
        x, y = data.next_batch(4)                    # [4, 3, V] float32, normalised
        xg, yg = data.next_batch(4, domain="grid")   # [4, 3, 64, 128]
        both = data.next_batch(4, domain="both")     # {"points": (x, y), "grid": (x, y)}
        val = data.validation_set(64, seed=1234, cache_dir="cache/swe")
    """

    def __init__(
        self,
        config: ShallowWaterConfig | None = None,
        points: torch.Tensor | None = None,
        device: str | torch.device = "cpu",
    ):
        from torch_harmonics.examples import ShallowWaterSolver

        self.config = config if config is not None else ShallowWaterConfig()
        if not isinstance(self.config, ShallowWaterConfig):
            raise TypeError(f"expected a ShallowWaterConfig, got {type(self.config).__name__}")
        cfg = self.config
        self.device = torch.device(device)
        with _torch_threads(cfg.num_threads):
            self.solver = ShallowWaterSolver(
                cfg.nlat, cfg.nlon, cfg.dt_solver, lmax=cfg.lmax, mmax=cfg.lmax, grid=cfg.grid
            ).to(self.device)
        self.lmax, self.mmax = int(self.solver.lmax), int(self.solver.mmax)
        self.points: torch.Tensor | None = None
        self.basis: torch.Tensor | None = None
        if points is not None:
            self.points = _check_points(points).to(self.device)
            with _torch_threads(cfg.num_threads):
                self.basis = real_sh_basis(self.points, self.lmax, self.mmax)
        self.points_key = points_hash(self.points)
        self.generator = torch.Generator(device=self.device)
        self.reseed(cfg.seed)
        self._mean: torch.Tensor | None = None
        self._std: torch.Tensor | None = None

    # ---- shapes ------------------------------------------------------------------------

    def pair_bytes(self) -> int:
        """Memory of one ``(x, y)`` pair as a validation set keeps it: the exact spectral states (complex128)
        and the fields on the grid and on the point set (float32)."""
        cfg = self.config
        fields = 3 * (cfg.nlat * cfg.nlon + (self.num_points or 0)) * 4
        return 2 * (3 * self.lmax * self.mmax * 16 + fields)

    def check_fits(self, num: int, what: str) -> None:
        """:class:`~eqvit.utils.MemoryBudgetError` when ``num`` pairs (``what``) would not fit in the machine's
        memory."""
        check_memory(what, num * self.pair_bytes(), f"{num:,} pairs x {format_bytes(self.pair_bytes())}")

    @property
    def num_points(self) -> int | None:
        return None if self.points is None else self.points.shape[0]

    @property
    def grid_shape(self) -> tuple[int, int]:
        return (self.config.nlat, self.config.nlon)

    @property
    def default_domain(self) -> str:
        return "grid" if self.points is None else "points"

    def reseed(self, seed: int) -> None:
        """Restart the training stream from ``seed`` (drops the trajectory pool)."""
        self.generator.manual_seed(_derive_seed(seed, "train"))
        self._pool: torch.Tensor | None = None
        self._pool_age: torch.Tensor | None = None

    # ---- spectral states ----------------------------------------------------------------

    def random_initial_condition(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` random states ``[n, 3, lmax, mmax]`` complex128.

        The formula of ``ShallowWaterSolver.random_initial_condition(mach)``, batched and with an
        explicit generator: for ``n = 1`` and a generator seeded like the global RNG it returns
        exactly what the solver returns.
        """
        s = self.solver
        gen = self.generator if generator is None else generator
        ctype = torch.complex128
        dev = self.device
        llimit = mlimit = 120  # the example's limits (it fills up to degree/order 120)
        nl, nm = min(llimit, self.lmax), min(mlimit, self.mmax)
        uspec = torch.zeros(n, 3, self.lmax, self.mmax, dtype=ctype, device=dev)
        scale = torch.sqrt(torch.tensor(4 * torch.pi / llimit / (llimit + 1), device=dev, dtype=ctype))
        uspec[..., :nl, :nm] = scale * torch.randn(n, 3, nl, nm, dtype=ctype, device=dev, generator=gen)
        uspec[:, 0] = s.gravity * s.hamp * uspec[:, 0]
        uspec[:, 0, 0, 0] += torch.sqrt(torch.tensor(4 * torch.pi, device=dev, dtype=ctype)) * s.havg * s.gravity
        uspec[:, 1:] = self.config.mach * uspec[:, 1:] * torch.sqrt(s.gravity * s.havg) / s.radius
        return torch.tril(uspec)

    @torch.no_grad()
    def step(self, spec: torch.Tensor, num_steps: int = 1) -> torch.Tensor:
        """Advance states ``[..., 3, lmax, mmax]`` by ``num_steps * dt`` (each ``dt`` is one
        ``solver.timestep(., num_substeps)`` call, batched)."""
        self._check_spec(spec)
        with _torch_threads(self.config.num_threads):
            for _ in range(num_steps):
                spec = _timestep(self.solver, spec, self.config.num_substeps)
        return spec

    def fresh_states(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random initial conditions advanced by ``spinup_steps``."""
        with torch.no_grad():
            spec = self.random_initial_condition(n, generator)
            if self.config.spinup_steps:
                spec = self.step(spec, self.config.spinup_steps)
        return spec

    @torch.no_grad()
    def next_spectral_pairs(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``batch_size`` pairs ``(x, y)`` of spectral states ``[B, 3, lmax, mmax]``.

        With ``steps_per_trajectory == 1`` each pair starts from a fresh state. Otherwise a pool
        of ``batch_size`` trajectories is kept: every call advances all of them by ``dt``
        (``y`` becomes the next call's ``x``) and re-seeds those that have produced
        ``steps_per_trajectory`` pairs (ages are staggered so re-seeding is spread out).
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"expected batch_size to be a positive int, got {batch_size!r}")
        k = self.config.steps_per_trajectory
        if k == 1:
            x = self.fresh_states(batch_size)
            return x, self.step(x)
        if self._pool is None or self._pool.shape[0] != batch_size:
            self._pool = self.fresh_states(batch_size)
            self._pool_age = torch.arange(batch_size, device=self.device) % k
        x = self._pool
        y = self.step(x)
        age = self._pool_age + 1
        expired = age >= k
        pool = y.clone()
        if bool(expired.any()):
            pool[expired] = self.fresh_states(int(expired.sum()))
            age = torch.where(expired, torch.zeros_like(age), age)
        self._pool, self._pool_age = pool, age
        return x, y

    # ---- synthesis and normalisation ---------------------------------------------------

    def _check_spec(self, spec: torch.Tensor) -> None:
        if not torch.is_complex(spec) or spec.ndim < 3 or tuple(spec.shape[-3:]) != (3, self.lmax, self.mmax):
            raise ValueError(
                f"expected complex spectral states of shape [..., 3, {self.lmax}, {self.mmax}], "
                f"got {spec.dtype} {list(spec.shape)}"
            )

    def synthesize_points(self, spec: torch.Tensor, basis: torch.Tensor | None = None) -> torch.Tensor:
        """Exact fields at the point set: ``[..., lmax, mmax]`` complex -> ``[..., V]`` float64."""
        basis = self.basis if basis is None else basis
        if basis is None:
            raise ValueError("no point set: construct ShallowWaterData(points=...) or pass a basis")
        if not torch.is_complex(spec) or tuple(spec.shape[-2:]) != (self.lmax, self.mmax):
            raise ValueError(
                f"expected complex coefficients [..., {self.lmax}, {self.mmax}], got {spec.dtype} {list(spec.shape)}"
            )
        with _torch_threads(self.config.num_threads):
            return pack_real_coefficients(spec.to(torch.complex128)) @ basis

    def synthesize_grid(self, spec: torch.Tensor) -> torch.Tensor:
        """The solver's own grid output ``[..., nlat, nlon]`` float64 (``solver.spec2grid``)."""
        with torch.no_grad(), _torch_threads(self.config.num_threads):
            return self.solver.spec2grid(spec.to(torch.complex128))

    @property
    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel ``(mean, std)`` ``[3]`` float64 in physical units: exact area-weighted
        spherical mean and standard deviation, pooled over ``stats_samples`` input states drawn
        from a generator of their own (so the training stream does not depend on them)."""
        if self._mean is None:
            gen = torch.Generator(device=self.device).manual_seed(_derive_seed(self.config.seed, "stats"))
            spec = self.fresh_states(self.config.stats_samples, gen)
            self._mean, self._std = self.spectral_moments(spec)
        return self._mean, self._std

    @staticmethod
    def spectral_moments(spec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Area-weighted per-channel mean and std of the fields of ``spec [N, C, L, M]``.

        With orthonormal harmonics, ``mean = Re a_00 / sqrt(4 pi)`` and
        ``(1/4pi) int f^2 = (1/4pi) sum_l (Re(a_l0)^2 + 2 sum_{m>0} |a_lm|^2)``.
        """
        a = spec.to(torch.complex128)
        mean = a[:, :, 0, 0].real.mean(dim=0) / math.sqrt(4 * math.pi)
        power = a.abs() ** 2
        power[..., 0] = a[..., 0].real ** 2
        power[..., 1:] *= 2.0
        mean_sq = power.sum(dim=(-2, -1)).mean(dim=0) / (4 * math.pi)
        std = (mean_sq - mean**2).clamp_min(0.0).sqrt()
        return mean, std

    def _broadcast_stats(self, x: torch.Tensor, channel_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = self.stats
        dim = channel_dim % x.ndim if x.ndim else 0
        if x.ndim == 0 or x.shape[dim] != mean.numel():
            raise ValueError(f"expected {mean.numel()} channels at dim {channel_dim}, got shape {list(x.shape)}")
        shape = [1] * x.ndim
        shape[dim] = -1
        return mean.to(x.device).reshape(shape), std.to(x.device).reshape(shape)

    def normalize(self, x: torch.Tensor, channel_dim: int = 1) -> torch.Tensor:
        """``(x - mean) / std`` per channel, in ``x``'s dtype (computed in float64)."""
        mean, std = self._broadcast_stats(x, channel_dim)
        return ((x.to(torch.float64) - mean) / std).to(x.dtype)

    def denormalize(self, x: torch.Tensor, channel_dim: int = 1) -> torch.Tensor:
        """Inverse of :meth:`normalize` (physical units)."""
        mean, std = self._broadcast_stats(x, channel_dim)
        return (x.to(torch.float64) * std + mean).to(x.dtype)

    def fields(self, spec: torch.Tensor, domain: str) -> torch.Tensor:
        """Normalised float32 fields of states ``[B, 3, lmax, mmax]`` on ``"points"``
        (``[B, 3, V]``) or ``"grid"`` (``[B, 3, nlat, nlon]``)."""
        if domain == "points":
            raw = self.synthesize_points(spec)
        elif domain == "grid":
            raw = self.synthesize_grid(spec)
        else:
            raise ValueError(f"unknown domain {domain!r}; expected 'points' or 'grid'")
        return self.normalize(raw, channel_dim=1).to(torch.float32)

    # ---- batches --------------------------------------------------------------------------

    def next_batch(self, batch_size: int, domain: str | None = None):
        """Next training batch.

        ``domain="points"`` (default with a point set) -> ``(x, y)`` of ``[B, 3, V]``;
        ``"grid"`` -> ``(x, y)`` of ``[B, 3, nlat, nlon]``; ``"both"`` -> ``{"points": (x, y),
        "grid": (x, y)}`` from the same simulations. float32, normalised.
        """
        domain = self.default_domain if domain is None else domain
        if domain not in _DOMAINS:
            raise ValueError(f"unknown domain {domain!r}; expected one of {list(_DOMAINS)}")
        if domain in ("points", "both") and self.basis is None:
            raise ValueError(f"domain {domain!r} needs a point set: construct ShallowWaterData(points=...)")
        spec_x, spec_y = self.next_spectral_pairs(batch_size)
        if domain == "both":
            return {d: (self.fields(spec_x, d), self.fields(spec_y, d)) for d in ("points", "grid")}
        return self.fields(spec_x, domain), self.fields(spec_y, domain)

    def next_rollout_batch(self, batch_size: int, num_steps: int, domain: str | None = None):
        """Next training batch with ``num_steps`` targets: ``(x [B, 3, ...], targets [K, B, 3, ...])``.

        ``x`` and ``targets[0]`` are the pair :meth:`next_batch` would give (the same draw from the
        stream); ``targets[k]`` is the solver's state ``k + 1`` steps after ``x``. ``domain``: ``"points"``
        or ``"grid"``, as :meth:`next_batch`.
        """
        domain = self.default_domain if domain is None else domain
        if domain not in ("points", "grid"):
            raise ValueError(f"unknown domain {domain!r}; expected 'points' or 'grid'")
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"expected num_steps to be an integer >= 1, got {num_steps!r}")
        if domain == "points" and self.basis is None:
            raise ValueError("domain 'points' needs a point set: construct ShallowWaterData(points=...)")
        spec_x, spec = self.next_spectral_pairs(batch_size)
        targets = [self.fields(spec, domain)]
        for _ in range(num_steps - 1):
            spec = self.step(spec)
            targets.append(self.fields(spec, domain))
        return self.fields(spec_x, domain), torch.stack(targets)

    def batches(self, batch_size: int, domain: str | None = None, num_batches: int | None = None):
        """Generator of :meth:`next_batch` results (endless when ``num_batches`` is None)."""
        i = 0
        while num_batches is None or i < num_batches:
            yield self.next_batch(batch_size, domain)
            i += 1

    # ---- validation -----------------------------------------------------------------------

    def validation_filename(self, num: int, seed: int) -> str:
        return f"swe_val_{self.config.key()}_seed{int(seed)}_n{int(num)}_pts{self.points_key}.safetensors"

    def validation_set(
        self, num: int, seed: int, cache_dir: str | os.PathLike | None = None, chunk_size: int = 16
    ) -> ValidationSet:
        """A fixed, seeded set of ``num`` fresh pairs (independent of the training stream).

        With ``cache_dir``, the set is stored as safetensors under a name keyed by the config,
        ``seed``, ``num`` and the point-set hash, with a SHA-256 of its tensors, and loaded from there
        when present and sound (an unreadable or damaged file is built again, with a warning).
        Regenerating without the cache gives bit-identical tensors (same chunking, same
        generator, same thread setting).
        """
        if not isinstance(num, int) or num < 1:
            raise ValueError(f"expected num to be a positive int, got {num!r}")
        self.check_fits(num, f"a shallow-water validation set of {num:,} pairs")
        if cache_dir is None:
            return self._build_validation(num, seed, chunk_size)
        path = Path(cache_dir) / self.validation_filename(num, seed)
        return cached(
            path,
            self._load_validation,
            lambda: self._build_validation(num, seed, chunk_size, path),
            lambda path, val: self._save_validation(val, path, seed),
            "shallow-water validation",
        )

    def _build_validation(self, num: int, seed: int, chunk_size: int, path: Path | None = None) -> ValidationSet:
        gen = torch.Generator(device=self.device).manual_seed(_derive_seed(seed, "validation"))
        xs, ys = [], []
        for start in range(0, num, chunk_size):
            x = self.fresh_states(min(chunk_size, num - start), gen)
            xs.append(x)
            ys.append(self.step(x))
        spec_x, spec_y = torch.cat(xs), torch.cat(ys)
        mean, std = self.stats
        val = ValidationSet(
            spec_x=spec_x,
            spec_y=spec_y,
            x_grid=self.fields(spec_x, "grid"),
            y_grid=self.fields(spec_y, "grid"),
            x_points=None if self.basis is None else self.fields(spec_x, "points"),
            y_points=None if self.basis is None else self.fields(spec_y, "points"),
            mean=mean.clone(),
            std=std.clone(),
            path=path,
        )
        return val

    def _save_validation(self, val: ValidationSet, path: Path, seed: int) -> None:
        tensors = {
            "spec_x": torch.view_as_real(val.spec_x),
            "spec_y": torch.view_as_real(val.spec_y),
            "x_grid": val.x_grid,
            "y_grid": val.y_grid,
            "mean": val.mean,
            "std": val.std,
        }
        if val.x_points is not None:
            tensors["x_points"] = val.x_points
            tensors["y_points"] = val.y_points
        metadata = {
            "config": json.dumps(dataclasses.asdict(self.config), sort_keys=True),
            "seed": str(int(seed)),
            "num": str(len(val)),
            "points_hash": self.points_key,
            "channels": ",".join(CHANNELS),
        }
        _save_safetensors_atomic(tensors, path, metadata)

    def _load_validation(self, path: Path) -> ValidationSet:
        t = {k: v.to(self.device) for k, v in _load_safetensors_verified(path, _VALIDATION_KEYS).items()}
        mean, std = self.stats
        if not (torch.equal(t["mean"], mean.to(t["mean"])) and torch.equal(t["std"], std.to(t["std"]))):
            raise CorruptCacheError(
                f"it was normalised with mean={t['mean'].tolist()}, std={t['std'].tolist()}, not with this "
                f"solver's mean={mean.tolist()}, std={std.tolist()}"
            )
        return ValidationSet(
            spec_x=torch.view_as_complex(t["spec_x"].contiguous()),
            spec_y=torch.view_as_complex(t["spec_y"].contiguous()),
            x_grid=t["x_grid"],
            y_grid=t["y_grid"],
            x_points=t.get("x_points"),
            y_points=t.get("y_points"),
            mean=t["mean"],
            std=t["std"],
            path=path,
        )


class ShallowWaterStream(torch.utils.data.IterableDataset):
    """``IterableDataset`` of whole batches; use ``DataLoader(stream, batch_size=None)``.

    In a multi-worker ``DataLoader`` each worker re-seeds its copy of the data source with
    ``(seed, worker id)`` so workers do not repeat each other.
    """

    def __init__(
        self,
        data: ShallowWaterData,
        batch_size: int,
        domain: str | None = None,
        num_batches: int | None = None,
    ):
        super().__init__()
        self.data = data
        self.batch_size = batch_size
        self.domain = domain
        self.num_batches = num_batches

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            self.data.reseed(_derive_seed(self.data.config.seed, f"worker{info.id}"))
        return self.data.batches(self.batch_size, self.domain, self.num_batches)
