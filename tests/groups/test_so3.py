"""Tests for eqvit.groups.so3: real Wigner-D matrices, spherical harmonics, rotation utilities.

Every property is measured by a small checker that returns an error (never a bool), and
`test_checkers_catch_broken_representations` feeds each checker a deliberately wrong D (transpose,
sign flip, scaling, change of basis, float32 arithmetic), so that none of them can pass vacuously.

Tolerances follow DESIGN.md: float64 inputs below 1e-10, float32 inputs below 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

import eqvit.groups.so3 as so3_module
from eqvit.groups.so3 import (
    axis_angle_to_matrix,
    euler_zyz_to_matrix,
    matrix_to_euler_zyz,
    random_rotations,
    rotation_angle,
    spherical_harmonics,
    wigner_D,
    wigner_D_blocks,
    wigner_D_list,
)

F64 = torch.float64
LS = list(range(9))
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}  # DESIGN.md: float64 below 1e-10, float32 below 1e-5
DType = torch.dtype
WignerFn = Callable[[int, torch.Tensor], torch.Tensor]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rotz(a: float | torch.Tensor) -> torch.Tensor:
    return euler_zyz_to_matrix(torch.as_tensor(a, dtype=F64), 0.0, 0.0)


# The permutation (x, y, z) -> (y, z, x) of e3nn's l = 1 basis: rows e_y, e_z, e_x.
P = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=F64)


def compose(R1: torch.Tensor, R2: torch.Tensor) -> torch.Tensor:
    """R1 @ R2 computed in float64 and rounded once to the inputs' dtype (the exact composite input)."""
    return (R1.double() @ R2.double()).to(R1.dtype)


# ----------------------------------------------------------------------------------------------------
# checkers: each returns the max abs error in float64, so a caller compares it with a tolerance


def homomorphism_error(D: WignerFn, l: int, R1: torch.Tensor, R2: torch.Tensor) -> float:
    lhs = D(l, R1).double() @ D(l, R2).double()
    return (lhs - D(l, compose(R1, R2)).double()).abs().max().item()


def orthogonality_error(D: WignerFn, l: int, R: torch.Tensor) -> float:
    d = D(l, R).double()
    return (d @ d.transpose(-1, -2) - torch.eye(2 * l + 1, dtype=F64)).abs().max().item()


def character(l: int, theta: torch.Tensor) -> torch.Tensor:
    """chi_l(theta) = sin((2l+1) theta/2) / sin(theta/2); at theta -> 0 the Taylor series of the limit 2l+1."""
    s = torch.sin(theta / 2)
    safe = s.abs() > 1e-6
    ratio = torch.sin((2 * l + 1) * theta / 2) / torch.where(safe, s, torch.ones_like(s))
    series = (2 * l + 1) * (1 - l * (l + 1) * theta**2 / 6)  # sum_m cos(m theta), to O(theta^4)
    return torch.where(safe, ratio, series)


def character_error(D: WignerFn, l: int, R: torch.Tensor) -> float:
    theta = rotation_angle(R.double())
    trace = D(l, R).double().diagonal(dim1=-2, dim2=-1).sum(-1)
    return (trace - character(l, theta)).abs().max().item()


def harmonics_error(D: WignerFn, l: int, R: torch.Tensor, x: torch.Tensor) -> float:
    """Y_l(R x) == D(R) Y_l(x): pins the basis, not just the equivalence class."""
    lhs = spherical_harmonics(l, x @ R.transpose(-1, -2))  # rows R x_i
    rhs = spherical_harmonics(l, x) @ D(l, R).transpose(-1, -2)
    return (lhs - rhs).abs().max().item()


def float64_internal_error(D: WignerFn, l: int, R32: torch.Tensor) -> float:
    """Distance of D(R32) from the float64 result on the same (float32-valued) input."""
    return (D(l, R32).double() - wigner_D(l, R32.double())).abs().max().item()


# ----------------------------------------------------------------------------------------------------
# the checkers fail on wrong representations


def _basis_change(l: int) -> torch.Tensor:
    # reversing the order m = -l..l keeps orthogonality, homomorphism and characters intact
    return torch.eye(2 * l + 1, dtype=F64).flip(0)


def _float32_pipeline(l: int, R32: torch.Tensor) -> torch.Tensor:
    """D from the same construction done in float32 arithmetic: least squares Y(R p) = D Y(p)."""
    pts = torch.randn(4 * l + 4, 3, generator=gen(5), dtype=F64)
    y = spherical_harmonics(l, pts).float()  # [N, 2l+1]
    y_rot = spherical_harmonics(l, (pts.float() @ R32.transpose(-1, -2)).double()).float()  # [..., N, 2l+1]
    return torch.linalg.lstsq(y.expand(y_rot.shape), y_rot).solution.transpose(-1, -2)


BROKEN: dict[str, WignerFn] = {
    "transpose": lambda l, R: wigner_D(l, R).transpose(-1, -2),
    "negated": lambda l, R: -wigner_D(l, R),
    "scaled": lambda l, R: 1.001 * wigner_D(l, R),
    "other_basis": lambda l, R: _basis_change(l) @ wigner_D(l, R).double() @ _basis_change(l).T,
    "float32_arithmetic": _float32_pipeline,
}


@pytest.mark.parametrize(
    "check, broken",
    [
        ("homomorphism", "transpose"),
        ("homomorphism", "negated"),
        ("orthogonality", "scaled"),
        ("character", "negated"),
        ("harmonics", "transpose"),
        ("harmonics", "other_basis"),
        ("float64_internal", "float32_arithmetic"),
    ],
)
@pytest.mark.parametrize("l", [2, 5])
def test_checkers_catch_broken_representations(check: str, broken: str, l: int) -> None:
    R1, R2 = random_rotations(16, generator=gen(1)), random_rotations(16, generator=gen(2))
    x = torch.randn(32, 3, generator=gen(3), dtype=F64)
    D = BROKEN[broken]
    # (error, threshold): wrong D's must miss the test tolerance by a factor 100, float32 arithmetic (a
    # few float32 ulps off) must at least miss it.
    err, tol = {
        "homomorphism": (lambda: homomorphism_error(D, l, R1, R2), 100 * TOL[F64]),
        "orthogonality": (lambda: orthogonality_error(D, l, R1), 100 * TOL[F64]),
        "character": (lambda: character_error(D, l, R1), 100 * TOL[F64]),
        "harmonics": (lambda: harmonics_error(D, l, R1[0], x), 100 * TOL[F64]),
        "float64_internal": (lambda: float64_internal_error(D, l, R1.float()), 1.2e-7),
    }[check]
    assert err() > tol, f"{check} did not notice the {broken} D"


# ----------------------------------------------------------------------------------------------------
# Wigner-D: the representation properties, l = 0..8


@pytest.mark.parametrize("l", LS)
def test_homomorphism(l: int) -> None:
    R1, R2 = random_rotations(64, generator=gen(10)), random_rotations(64, generator=gen(11))
    assert homomorphism_error(wigner_D, l, R1, R2) < TOL[F64]


@pytest.mark.parametrize("l", LS)
def test_orthogonal(l: int) -> None:
    assert orthogonality_error(wigner_D, l, random_rotations(64, generator=gen(12))) < 1e-12


@pytest.mark.parametrize("l", LS)
def test_identity(l: int) -> None:
    eye = torch.eye(3, dtype=F64).expand(4, 3, 3)
    assert (wigner_D(l, eye) - torch.eye(2 * l + 1, dtype=F64)).abs().max() < 1e-12


@pytest.mark.parametrize("l", LS)
def test_character(l: int) -> None:
    # random rotations, tiny angles (where the ratio is 0/0-like) and half-turns
    axes = torch.randn(6, 3, generator=gen(13), dtype=F64)
    small = axis_angle_to_matrix(axes, torch.tensor([0.0, 1e-12, 1e-7, 1e-4, math.pi - 1e-7, math.pi], dtype=F64))
    R = torch.cat([random_rotations(64, generator=gen(14)), small])
    assert character_error(wigner_D, l, R) < TOL[F64]


def test_character_formula_is_the_dirichlet_sum() -> None:
    # the reference itself: chi_l = sum_{m=-l..l} cos(m theta), including theta = 0 and pi
    theta = torch.tensor([0.0, 1e-9, 1e-6, 1e-3, 0.7, 2.0, math.pi], dtype=F64)
    for l in LS:
        dirichlet = sum(torch.cos(m * theta) for m in range(-l, l + 1))
        assert (character(l, theta) - dirichlet).abs().max() < 1e-12


def test_l0_and_l1_conventions() -> None:
    R = random_rotations(16, generator=gen(15))
    assert torch.equal(wigner_D(0, R), torch.ones(16, 1, 1, dtype=F64))
    assert (wigner_D(1, R) - P @ R @ P.T).abs().max() == 0  # a permutation, no arithmetic
    assert torch.equal(wigner_D(1, R.float()), (P @ R @ P.T).float())


@pytest.mark.parametrize("l", LS)
def test_harmonics_equivariance(l: int) -> None:
    x = torch.randn(40, 3, generator=gen(16), dtype=F64)
    for R in random_rotations(4, generator=gen(17)):
        assert harmonics_error(wigner_D, l, R, x) < TOL[F64]


def test_harmonics_closed_forms() -> None:
    # Standard real harmonics, no Condon-Shortley phase (e.g. Y_{1,1} = +sqrt(3/4pi) x).
    x = torch.randn(20, 3, generator=gen(18), dtype=F64)
    u = x / x.norm(dim=-1, keepdim=True)
    X, Y, Z = u.unbind(-1)
    c1 = math.sqrt(3 / (4 * math.pi))
    assert (spherical_harmonics(1, x) - c1 * torch.stack([Y, Z, X], -1)).abs().max() < 1e-14
    y2 = torch.stack(
        [
            0.5 * math.sqrt(15 / math.pi) * X * Y,
            0.5 * math.sqrt(15 / math.pi) * Y * Z,
            0.25 * math.sqrt(5 / math.pi) * (3 * Z * Z - 1),
            0.5 * math.sqrt(15 / math.pi) * X * Z,
            0.25 * math.sqrt(15 / math.pi) * (X * X - Y * Y),
        ],
        dim=-1,
    )
    assert (spherical_harmonics(2, x) - y2).abs().max() < 1e-14
    assert (spherical_harmonics(0, x) - 0.5 / math.sqrt(math.pi)).abs().max() < 1e-15


def test_harmonics_orthonormal() -> None:
    # Gauss-Legendre in z times the trapezoid rule in phi integrates degree <= 2L polynomials exactly,
    # so the Gram matrix of all Y_l, l <= L, must be the identity: this makes wigner_D orthogonal.
    L = 8
    z, w = (torch.as_tensor(a, dtype=F64) for a in __import__("numpy").polynomial.legendre.leggauss(L + 1))
    phi = torch.arange(2 * L + 2, dtype=F64) * (2 * math.pi / (2 * L + 2))
    zz, pp = torch.meshgrid(z, phi, indexing="ij")
    s = torch.sqrt(1 - zz**2)
    pts = torch.stack([s * pp.cos(), s * pp.sin(), zz], -1).reshape(-1, 3)
    weights = (w[:, None] * (2 * math.pi / (2 * L + 2))).expand_as(zz).reshape(-1)
    Y = torch.cat([spherical_harmonics(l, pts) for l in range(L + 1)], dim=-1)  # [N, (L+1)^2]
    gram = Y.T @ (weights[:, None] * Y)
    assert (gram - torch.eye((L + 1) ** 2, dtype=F64)).abs().max() < 1e-12


def test_gradients_flow() -> None:
    # D is a polynomial in R's entries, so autograd works (here on arbitrary matrices, not only rotations).
    R = random_rotations(2, generator=gen(19)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda r: wigner_D(3, r), (R,))


# ----------------------------------------------------------------------------------------------------
# configurations where angle-based formulas are singular


def _half_turns() -> torch.Tensor:
    n = torch.randn(8, 3, generator=gen(20), dtype=F64)
    n = n / n.norm(dim=-1, keepdim=True)
    random_axes = 2 * n[:, :, None] * n[:, None, :] - torch.eye(3, dtype=F64)  # exactly a rotation by pi
    coordinate_axes = torch.stack(
        [torch.diag(torch.tensor(d, dtype=F64)) for d in ([1, -1, -1], [-1, 1, -1], [-1, -1, 1])]
    )
    return torch.cat([random_axes, coordinate_axes])


def _poles() -> torch.Tensor:
    """beta = 0 (rotations about z) and beta = pi, exact and through euler_zyz_to_matrix (sin(pi) != 0)."""
    a = torch.tensor([0.0, 0.3, -1.2, math.pi / 2, math.pi, -math.pi + 1e-9], dtype=F64)
    flip = torch.diag(torch.tensor([-1.0, 1.0, -1.0], dtype=F64))  # Ry(pi), exactly
    return torch.cat(
        [
            rotz(a),
            rotz(a) @ flip @ rotz(0.7),
            euler_zyz_to_matrix(a, 0.0, 0.4),
            euler_zyz_to_matrix(a, math.pi, -0.4),
        ]
    )


SPECIAL = {"half_turns": _half_turns, "poles": _poles, "identity": lambda: torch.eye(3, dtype=F64)[None]}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", list(SPECIAL))
@pytest.mark.parametrize("l", LS)
def test_exact_at_singular_configurations(l: int, kind: str, dtype: DType) -> None:
    S = SPECIAL[kind]().to(dtype)
    G = random_rotations(len(S), generator=gen(21), dtype=dtype)
    tol = TOL[dtype]
    assert homomorphism_error(wigner_D, l, S, G) < tol
    assert homomorphism_error(wigner_D, l, G, S) < tol
    assert homomorphism_error(wigner_D, l, S, S.flip(0)) < tol
    assert orthogonality_error(wigner_D, l, S) < tol
    assert character_error(wigner_D, l, S) < tol
    if kind == "half_turns":  # D(S)^2 = D(S^2) = D(I) = I
        d = wigner_D(l, S).double()
        assert (d @ d - torch.eye(2 * l + 1, dtype=F64)).abs().max() < tol


@pytest.mark.parametrize("l", LS)
def test_float32_input_is_computed_in_float64(l: int) -> None:
    # Same float32 values, computed once by the float32 path and once from a float64 copy: the only
    # difference allowed is the final rounding to float32 (one ulp of numbers <= 1).
    R32 = torch.cat([random_rotations(32, generator=gen(22)), _half_turns(), _poles()]).float()
    assert float64_internal_error(wigner_D, l, R32) <= 1.2e-7
    blocks = wigner_D_blocks(l, R32).double()
    assert (blocks - wigner_D_blocks(l, R32.double())).abs().max() <= 1.2e-7


def _near_singular() -> torch.Tensor:
    """Random rotations plus the identity, tiny angles, near and exact half-turns, and the poles."""
    axes = torch.randn(6, 3, generator=gen(44), dtype=F64)
    angles = torch.tensor([1e-12, 1e-7, 1e-3, math.pi - 1e-9, math.pi - 1e-4, math.pi], dtype=F64)
    return torch.cat(
        [
            random_rotations(16, generator=gen(45)),
            torch.eye(3, dtype=F64)[None],
            axis_angle_to_matrix(axes, angles),
            _half_turns(),
            _poles(),
        ]
    )


@pytest.mark.parametrize("l", range(11))
def test_recurrence_matches_harmonics_least_squares(l: int) -> None:
    # Independent reference: D from Y_l(R x) = D Y_l(x) at 4l+4 random points, solved by least squares on
    # spherical_harmonics (the Legendre recursion, not the Wigner-D recurrence). Well-conditioned, so
    # the reference itself is good to ~1e-14.
    R = _near_singular()
    x = torch.randn(4 * l + 4, 3, generator=gen(46), dtype=F64)
    y = spherical_harmonics(l, x)  # [N, 2l+1]
    y_rot = spherical_harmonics(l, x @ R.transpose(-1, -2))  # [B, N, 2l+1]: rows R x_i
    reference = torch.linalg.lstsq(y.expand(y_rot.shape), y_rot).solution.transpose(-1, -2)
    assert (wigner_D(l, R) - reference).abs().max() < 1e-12
    blocks = wigner_D_blocks(l, R)[:, l * l :, l * l :]
    assert (blocks - reference).abs().max() < 1e-12


# ----------------------------------------------------------------------------------------------------
# dtype, device, shapes, blocks

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("l", [0, 1, 2, 6])
def test_dtype_and_device_passthrough(l: int, dtype: DType, device: str) -> None:
    R = random_rotations(5, generator=gen(23))
    Rd = R.to(device=device, dtype=dtype)
    for out, d in [(wigner_D(l, Rd), 2 * l + 1), (wigner_D_blocks(l, Rd), (l + 1) ** 2)]:
        assert out.dtype == dtype and out.device == Rd.device and out.shape == (5, d, d)
    # whatever the dtype, the arithmetic is float64: the only difference from a float64 call on the same
    # values is the final rounding of entries of size <= ~1
    ref = wigner_D(l, Rd.to(device="cpu", dtype=F64))
    assert (wigner_D(l, Rd).cpu().double() - ref).abs().max() <= torch.finfo(dtype).eps


@pytest.mark.parametrize("batch", [(), (5,), (2, 3), (0,)], ids=str)
@pytest.mark.parametrize("l", [0, 1, 3])
def test_batch_shapes(l: int, batch: tuple[int, ...]) -> None:
    n = math.prod(batch)
    R = random_rotations(n, generator=gen(24)).reshape(batch + (3, 3))
    d, db = 2 * l + 1, (l + 1) ** 2
    D, B = wigner_D(l, R), wigner_D_blocks(l, R)
    assert D.shape == batch + (d, d) and B.shape == batch + (db, db)
    # batching is elementwise: same numbers as the flat batch
    assert torch.equal(D.reshape(n, d, d), wigner_D(l, R.reshape(n, 3, 3)))
    if n:
        assert (wigner_D(l, R.reshape(n, 3, 3)[0]) - D.reshape(n, d, d)[0]).abs().max() < 1e-14


@pytest.mark.parametrize("l", LS)
def test_inverse_and_strided_input(l: int) -> None:
    # D(R^T) = D(R)^T, with R^T a non-contiguous view; expanded (stride-0) batches work too
    R = random_rotations(6, generator=gen(42))
    assert (wigner_D(l, R.transpose(-1, -2)) - wigner_D(l, R).transpose(-1, -2)).abs().max() < 1e-12
    D = wigner_D(l, R[:1].expand(4, 3, 3))
    assert D.shape == (4, 2 * l + 1, 2 * l + 1) and (D[0] - D[3]).abs().max() < 1e-14


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L", [0, 1, 2, 4, 7])
def test_blocks(L: int, dtype: DType) -> None:
    R1 = random_rotations(8, generator=gen(25), dtype=dtype)
    R2 = random_rotations(8, generator=gen(26), dtype=dtype)
    # float64: the same numbers as wigner_D; float32: the rounded inputs are not exactly rotations, and
    # off SO(3) the two evaluations (different sample points) may differ at the inputs' precision
    same = 1e-12 if dtype == F64 else TOL[dtype]
    B = wigner_D_blocks(L, R1)
    mask = torch.zeros(B.shape[-2:], dtype=torch.bool)
    for l in range(L + 1):
        sl = slice(l * l, (l + 1) ** 2)
        mask[sl, sl] = True
        assert (B[:, sl, sl].double() - wigner_D(l, R1).double()).abs().max() < same
    assert torch.all(B[:, ~mask] == 0)  # off-diagonal blocks exactly zero

    def blocks(_: int, R: torch.Tensor) -> torch.Tensor:
        return wigner_D_blocks(L, R)

    assert homomorphism_error(blocks, L, R1, R2) < TOL[dtype]
    dd = B.double()
    assert (dd @ dd.transpose(-1, -2) - torch.eye((L + 1) ** 2, dtype=F64)).abs().max() < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L", [0, 1, 2, 7])
@pytest.mark.parametrize("batch", [(4,), (2, 3), (0,)], ids=str)
def test_list_holds_every_degree(L: int, dtype: DType, batch: tuple[int, ...]) -> None:
    """``wigner_D_list(L, R)[l]`` is ``wigner_D(l, R)`` and the blocks of ``wigner_D_blocks(L, R)``."""
    R = random_rotations(math.prod(batch), generator=gen(27), dtype=dtype).reshape(batch + (3, 3))
    Ds = wigner_D_list(L, R)
    assert len(Ds) == L + 1
    B = wigner_D_blocks(L, R)
    for l, D in enumerate(Ds):
        assert D.dtype == dtype and D.shape == batch + (2 * l + 1, 2 * l + 1)
        assert torch.equal(D, wigner_D(l, R))
        assert torch.equal(D, B[..., l * l : (l + 1) ** 2, l * l : (l + 1) ** 2])


def test_chunked_batches_match(monkeypatch: pytest.MonkeyPatch) -> None:
    # huge batches are processed in chunks; force chunks of one or two poses
    R = random_rotations(5, generator=gen(43))
    whole = wigner_D(6, R), wigner_D_blocks(6, R), wigner_D_list(6, R)
    monkeypatch.setattr(so3_module, "_CHUNK_BYTES", 1)
    assert (wigner_D(6, R) - whole[0]).abs().max() < 1e-14
    assert (wigner_D_blocks(6, R) - whole[1]).abs().max() < 1e-14
    for chunked, one_pass in zip(wigner_D_list(6, R), whole[2]):
        assert (chunked - one_pass).abs().max() < 1e-14


def test_outputs_are_fresh_copies() -> None:
    # the cached constants must not leak: scribbling on a result leaves the next call intact
    eye = torch.eye(3, dtype=F64)
    wigner_D(4, eye).zero_()
    wigner_D_blocks(4, eye).zero_()
    assert (wigner_D(4, eye) - torch.eye(9, dtype=F64)).abs().max() < 1e-12
    assert (wigner_D_blocks(4, eye) - torch.eye(25, dtype=F64)).abs().max() < 1e-12


# ----------------------------------------------------------------------------------------------------
# Euler angles, random rotations, angles, axis-angle


def test_euler_matches_axis_rotations() -> None:
    a, b, g = (torch.rand(16, generator=gen(27 + i), dtype=F64) * 6 - 3 for i in range(3))
    ez, ey = torch.tensor([0.0, 0.0, 1.0], dtype=F64), torch.tensor([0.0, 1.0, 0.0], dtype=F64)
    expected = axis_angle_to_matrix(ez, a) @ axis_angle_to_matrix(ey, b) @ axis_angle_to_matrix(ez, g)
    assert (euler_zyz_to_matrix(a, b, g) - expected).abs().max() < 1e-14


def test_euler_round_trip_generic() -> None:
    R = random_rotations(256, generator=gen(30))
    alpha, beta, gamma = matrix_to_euler_zyz(R)
    assert (euler_zyz_to_matrix(alpha, beta, gamma) - R).abs().max() < 1e-13
    assert bool(((beta >= 0) & (beta <= math.pi) & (alpha.abs() <= math.pi) & (gamma.abs() <= math.pi)).all())
    # and the angles themselves come back, away from the poles
    a = torch.rand(256, generator=gen(31), dtype=F64) * 6.2 - 3.1
    b = torch.rand(256, generator=gen(32), dtype=F64) * 3.0 + 0.07
    g = torch.rand(256, generator=gen(33), dtype=F64) * 6.2 - 3.1
    back = matrix_to_euler_zyz(euler_zyz_to_matrix(a, b, g))
    assert max((x - y).abs().max().item() for x, y in zip(back, (a, b, g))) < 1e-12


@pytest.mark.parametrize("pole", [0.0, math.pi])
def test_euler_at_poles(pole: float) -> None:
    a = torch.tensor([0.0, 0.5, -2.0, 3.0, math.pi], dtype=F64)
    g = torch.tensor([0.0, 0.3, 1.0, -2.5, 0.1], dtype=F64)
    flip = torch.diag(torch.tensor([-1.0, 1.0, -1.0], dtype=F64))
    exact = rotz(a) @ (flip if pole else torch.eye(3, dtype=F64)) @ rotz(g)  # sin(beta) exactly 0
    via_euler = euler_zyz_to_matrix(a, pole, g)  # sin(pi) = 1.2e-16 here
    for R in (exact, via_euler):
        alpha, beta, gamma = matrix_to_euler_zyz(R)
        assert torch.all(beta == pole) and torch.all(gamma == 0)  # the documented choice at the poles
        assert (euler_zyz_to_matrix(alpha, beta, gamma) - R).abs().max() < 1e-14


@pytest.mark.parametrize("beta", [1e-14, 1e-9, 1e-5, math.pi - 1e-5, math.pi - 1e-9, math.pi - 1e-14])
def test_euler_near_poles(beta: float) -> None:
    # where sin(beta) is tiny, alpha +- gamma must not be read off the entries it multiplies
    a = torch.tensor([0.4, -2.9, 1.7], dtype=F64)
    g = torch.tensor([-1.1, 2.2, 3.0], dtype=F64)
    R = euler_zyz_to_matrix(a, beta, g)
    assert (euler_zyz_to_matrix(*matrix_to_euler_zyz(R)) - R).abs().max() < 1e-14


def test_euler_float32() -> None:
    R = torch.cat([random_rotations(64, generator=gen(34)), _poles(), _half_turns()]).float()
    out = matrix_to_euler_zyz(R)
    assert all(t.dtype == torch.float32 for t in out)
    assert (euler_zyz_to_matrix(*out) - R).abs().max() < 1e-5


def test_random_rotations() -> None:
    R = random_rotations(20000, generator=gen(35))
    assert R.shape == (20000, 3, 3) and R.dtype == F64
    assert (R @ R.transpose(-1, -2) - torch.eye(3, dtype=F64)).abs().max() < 1e-14
    assert (torch.linalg.det(R) - 1).abs().max() < 1e-14
    assert torch.equal(random_rotations(3, generator=gen(36)), random_rotations(3, generator=gen(36)))
    assert random_rotations(2, dtype=torch.float32).dtype == torch.float32
    assert haar_statistics_error(R) < 0.02


def haar_statistics_error(R: torch.Tensor) -> float:
    """Haar measure: E[R] = 0 and E[angle] = pi/2 + 2/pi (density (1 - cos t)/pi on [0, pi])."""
    mean_angle = rotation_angle(R).mean().item()
    return max(R.mean(0).abs().max().item(), abs(mean_angle - (math.pi / 2 + 2 / math.pi)))


def test_haar_statistics_can_fail() -> None:
    # uniform axis and uniform angle is the classic non-Haar sampler: its mean angle is pi/2
    axes = torch.randn(20000, 3, generator=gen(37), dtype=F64)
    angles = torch.rand(20000, generator=gen(38), dtype=F64) * math.pi
    assert haar_statistics_error(axis_angle_to_matrix(axes, angles)) > 0.3


def test_rotation_angle() -> None:
    theta = torch.tensor([0.0, 1e-12, 1e-8, 0.3, 2.0, math.pi - 1e-8, math.pi - 1e-12, math.pi], dtype=F64)
    axes = torch.randn(len(theta), 3, generator=gen(39), dtype=F64)
    R = axis_angle_to_matrix(axes, theta)
    assert (rotation_angle(R) - theta).abs().max() < 1e-14
    assert rotation_angle(R.float()).dtype == torch.float32
    assert rotation_angle(torch.eye(3, dtype=F64)).shape == ()


def test_axis_angle_to_matrix() -> None:
    axes = torch.randn(10, 3, generator=gen(40), dtype=F64)
    R = axis_angle_to_matrix(axes, torch.linspace(-4, 4, 10, dtype=F64))
    assert (R @ R.transpose(-1, -2) - torch.eye(3, dtype=F64)).abs().max() < 1e-14
    assert (torch.linalg.det(R) - 1).abs().max() < 1e-14
    assert ((R @ axes[..., None])[..., 0] - axes).abs().max() < 1e-14  # the axis is fixed
    assert (axis_angle_to_matrix(torch.tensor([0.0, 0.0, 2.0]), 0.5) - rotz(0.5).float()).abs().max() < 1e-7


# ----------------------------------------------------------------------------------------------------
# bad input: ValueError naming what was expected and what came


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: wigner_D(-1, torch.eye(3)), r"expected l to be a non-negative int, got -1"),
        (lambda: wigner_D(1.5, torch.eye(3)), r"expected l .* got 1\.5"),
        (lambda: wigner_D(True, torch.eye(3)), r"expected l .* got True"),
        (lambda: wigner_D(2, torch.eye(4)), r"expected R of shape \[\.\.\., 3, 3\], got \[4, 4\]"),
        (lambda: wigner_D(2, torch.zeros(2, 3, 4)), r"got \[2, 3, 4\]"),
        (lambda: wigner_D(2, torch.zeros(3)), r"got \[3\]"),
        (lambda: wigner_D(2, [[1, 0, 0]] * 3), r"expected R to be a torch\.Tensor .* got list"),
        (lambda: wigner_D(2, torch.eye(3, dtype=torch.int64)), r"floating-point dtype, got torch\.int64"),
        (lambda: wigner_D_blocks(-2, torch.eye(3)), r"expected L to be a non-negative int, got -2"),
        (lambda: wigner_D_blocks(2, torch.zeros(5, 9)), r"got \[5, 9\]"),
        (lambda: spherical_harmonics(2, torch.zeros(4, 2)), r"expected x .* \[\.\.\., 3\], got \[4, 2\]"),
        (lambda: matrix_to_euler_zyz(torch.zeros(3, 2)), r"got \[3, 2\]"),
        (lambda: rotation_angle(torch.zeros(2, 2)), r"got \[2, 2\]"),
        (lambda: random_rotations(-1), r"expected n to be a non-negative int, got -1"),
        (lambda: axis_angle_to_matrix(torch.zeros(3), 1.0), r"nonzero rotation axis"),
        (
            lambda: axis_angle_to_matrix(torch.zeros(2), 1.0),
            r"expected axis of shape \[\.\.\., 3\], got \[2\]",
        ),
    ],
)
def test_bad_input_raises_value_error(call: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------------------------------
# oracle: escnn's SO(3) irreps are equivalent to ours (same characters and an orthogonal intertwiner)


@pytest.mark.oracle
@pytest.mark.parametrize("l", [0, 1, 2, 3, 4])
def test_escnn_oracle(l: int) -> None:
    escnn_group = pytest.importorskip("escnn.group")
    so3 = escnn_group.so3_group(maximum_frequency=4)
    R = random_rotations(3, generator=gen(41))
    ours = wigner_D(l, R)
    theirs = torch.stack([torch.tensor(so3.irrep(l)(so3.element(r.numpy(), param="MAT"))) for r in R])
    # Q with theirs(R) Q = Q ours(R) for all R: vec(A Q - Q B) = (I (x) A - B^T (x) I) vec(Q), column-major.
    d = 2 * l + 1
    eye = torch.eye(d, dtype=F64)
    system = torch.cat([torch.kron(eye, a) - torch.kron(b.T.contiguous(), eye) for a, b in zip(theirs, ours)])
    sv = torch.linalg.svdvals(system)
    assert sv[-1] < 1e-10  # an intertwiner exists ...
    assert d == 1 or sv[-2] > 1e-3  # ... and is unique up to scale (Schur), so the irreps match
    Q = torch.linalg.svd(system).Vh[-1].reshape(d, d).T * math.sqrt(d)
    assert (Q @ Q.T - eye).abs().max() < 1e-10  # orthogonal: both are real orthogonal forms of D^l
