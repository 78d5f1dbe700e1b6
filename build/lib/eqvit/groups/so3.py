"""SO(3): real Wigner-D matrices computed from rotation matrices, and rotation utilities.

Conventions
-----------
* A rotation is a ``[..., 3, 3]`` tensor acting on column vectors; ``R1 @ R2`` applies ``R2`` first.
* Real spherical harmonics ``Y_l = (Y_{l,-l}, ..., Y_{l,l})`` have z as the polar axis, are orthonormal
  on the unit sphere and carry no Condon-Shortley phase: ``Y_{l,m} ∝ P_l^|m|(z) cos(m φ)`` for m > 0 and
  ``∝ P_l^|m|(z) sin(|m| φ)`` for m < 0. For l = 1 this is ``sqrt(3 / 4π) (y, z, x)``.
* ``wigner_D(l, R)`` is the matrix of the rotation in that basis, ``Y_l(R x) = wigner_D(l, R) @ Y_l(x)``.
  It is real orthogonal and a homomorphism, and ``wigner_D(1, R) = P R Pᵀ`` with P the permutation
  (x, y, z) -> (y, z, x), as in e3nn.

Method
------
``D^1 = P R Pᵀ`` is read off R, and ``D^l`` for l >= 2 follows from ``D^{l-1}`` and ``D^1`` by the
Ivanic-Ruedenberg recurrence for real spherical harmonics (J. Phys. Chem. 1996, 100, 6342, with the 1998
erratum), which is in exactly this basis and sign convention. Each entry of ``D^l`` is a fixed linear
combination of products ``D^1[i, j] D^{l-1}[a, b]``, so ``D^l`` is a polynomial in the entries of R. No
Euler angles or axis-angle appear anywhere, and there is no division or branch on the input, so nothing
is singular at the identity, at half-turns or at the poles: the result is as accurate there as anywhere
else. The poses sit on the last, contiguous axis, so each degree is a few long fused multiply-adds over
the whole batch. Everything is computed in float64 and returned in the caller's dtype and device.
(``spherical_harmonics`` uses the angle-free Legendre recursion of the solid harmonics, an independent
construction that the tests compare with.)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "axis_angle_to_matrix",
    "euler_zyz_to_matrix",
    "matrix_to_euler_zyz",
    "random_rotations",
    "rotation_angle",
    "spherical_harmonics",
    "wigner_D",
    "wigner_D_blocks",
    "wigner_D_list",
]

# (x, y, z) -> (y, z, x): the real l = 1 basis in the order m = -1, 0, 1.
_PERM_L1 = (1, 2, 0)
# float64 scratch per chunk of poses (all degrees of the recurrence and its temporaries).
_CHUNK_BYTES = 1 << 27


# ----------------------------------------------------------------------------------------------------
# input validation (ValueError naming what was expected and what came; never assert)


def _check_degree(l: int, name: str = "l") -> int:
    if isinstance(l, bool) or not isinstance(l, (int, np.integer)) or l < 0:
        raise ValueError(f"expected {name} to be a non-negative int, got {l!r}")
    return int(l)


def _check_rotations(R: Tensor, name: str = "R") -> None:
    if not isinstance(R, torch.Tensor):  # DESIGN.md: all bad input is a ValueError
        raise ValueError(f"expected {name} to be a torch.Tensor of shape [..., 3, 3], got {type(R).__name__}")
    if R.dim() < 2 or tuple(R.shape[-2:]) != (3, 3):
        raise ValueError(f"expected {name} of shape [..., 3, 3], got {list(R.shape)}")
    if not R.is_floating_point():
        raise ValueError(f"expected {name} with a floating-point dtype, got {R.dtype}")


def _work_device(device: torch.device) -> torch.device:
    # MPS has no float64; everything else computes where the data lives.
    return torch.device("cpu") if device.type == "mps" else device


# ----------------------------------------------------------------------------------------------------
# solid harmonics: constants and the angle-free recursion


class _Recursion(NamedTuple):
    """Coefficients of the real solid-harmonic recursion for degrees 0..L.

    In the order m = -l..l, with ``C_m + i S_m = (x + i y)^m`` and ``r2 = |x|^2``, for l >= 2:
    ``Y_l[±l] = top0[l-2] (S_l | C_l)``, ``Y_l[±(l-1)] = top1[l-2] z (S_{l-1} | C_{l-1})`` and for
    |m| <= l-2 ``Y_l[m] = a[l][m] z Y_{l-1}[m] - b[l][m] r2 Y_{l-2}[m]`` (the fully normalised associated
    Legendre recursion; the (x + i y)^m factor depends on m only, so it rides along unchanged).
    """

    c00: float  # Y_0 = 1 / sqrt(4 pi)
    top0: Tensor  # [L - 1, 1] for l = 2..L
    top1: Tensor  # [L - 1, 1] for l = 2..L
    top0_1: float  # l = 1 edges
    top1_1: float  # l = 1 centre (m = 0): sqrt(3) * c00
    a: tuple[Tensor | None, ...]  # a[l]: [2l - 3, 1] for l >= 2
    b: tuple[Tensor | None, ...]


@functools.cache
def _recursion(L: int, device: torch.device) -> _Recursion:
    # q_mm = normalised P_m^m / sin^m(theta) = sqrt((2m+1)/4pi) prod_{k<=m} sqrt((2k-1)/2k), built up as
    # q_mm = q_{m-1,m-1} sqrt((2m+1)/2m); sqrt(2) makes the real m != 0 harmonics orthonormal.
    qmm = [1 / math.sqrt(4 * math.pi)]
    for m in range(1, L + 1):
        qmm.append(qmm[-1] * math.sqrt((2 * m + 1) / (2 * m)))
    s2 = math.sqrt(2.0)
    a: list[Tensor | None] = [None, None]
    b: list[Tensor | None] = [None, None]
    for l in range(2, L + 1):
        m = np.abs(np.arange(-(l - 2), l - 1)).astype(np.float64)
        al = np.sqrt((4 * l * l - 1) / (l * l - m * m))
        bl = al * np.sqrt(((l - 1) ** 2 - m * m) / (4 * (l - 1) ** 2 - 1))
        a.append(torch.tensor(al, dtype=torch.float64, device=device).unsqueeze(-1))
        b.append(torch.tensor(bl, dtype=torch.float64, device=device).unsqueeze(-1))

    def col(v: list[float]) -> Tensor:
        return torch.tensor(v, dtype=torch.float64, device=device).reshape(-1, 1)

    return _Recursion(
        c00=qmm[0],
        top0=col([s2 * qmm[l] for l in range(2, L + 1)]),
        top1=col([math.sqrt(2 * l + 1) * s2 * qmm[l - 1] for l in range(2, L + 1)]),
        top0_1=s2 * qmm[1] if L >= 1 else 0.0,
        top1_1=math.sqrt(3.0) * qmm[0],
        a=tuple(a),
        b=tuple(b),
    )


def _solid_harmonics(L: int, xyz: Tensor) -> list[Tensor]:
    """Real solid harmonics of degrees 0..L at points ``xyz`` [3, K] (float64) -> list of [2l+1, K].

    Points sit on the last, contiguous axis, so each step is one long elementwise op over [*, K].
    Homogeneous polynomials throughout: no angles, no division, no special cases.
    """
    rec = _recursion(L, xyz.device)
    x, y, z = xyz.unbind(0)  # [K] each
    out = [torch.full_like(x, rec.c00).unsqueeze(0)]
    if L == 0:
        return out
    # (x + i y)^m, m = 1..L, as Re/Im: r^m sin^m(theta) (cos, sin)(m phi) without any angle.
    powers = torch.cumprod(torch.complex(x, y).expand(L, -1), dim=0)  # [L, K], index m - 1
    C, S = powers.real, powers.imag
    out.append(torch.stack([rec.top0_1 * S[0], rec.top1_1 * z, rec.top0_1 * C[0]]))
    if L == 1:
        return out
    r2 = x * x + y * y + z * z  # kept (not 1) so Y_l stays a homogeneous polynomial
    # Edge rows of every degree at once, [L-1, K] each; row l-2 belongs to degree l.
    lo_l, lo_l1 = rec.top0 * S[1:], rec.top1 * (z * S[: L - 1])
    hi_l1, hi_l = rec.top1 * (z * C[: L - 1]), rec.top0 * C[1:]
    for l in range(2, L + 1):
        i = l - 2
        mid = torch.addcmul(rec.a[l] * (z * out[l - 1][1:-1]), rec.b[l] * out[l - 2], r2, value=-1.0)
        out.append(torch.cat([lo_l[i : i + 1], lo_l1[i : i + 1], mid, hi_l1[i : i + 1], hi_l[i : i + 1]]))
    return out


# ----------------------------------------------------------------------------------------------------
# Wigner-D: the Ivanic-Ruedenberg recurrence D^{l-1}, D^1 -> D^l


# Term k of the recurrence: (source, row shift, row r of D^1). Source 0 is D^{l-1}, source 1 the same
# with its rows reversed (row a of it is row -a of D^{l-1}); r = 0, 1, 2 is i = -1, 0, 1 in the paper.
# Target row m of D^l reads row m + shift of the source. Term 0 is u U, terms 1-4 split v V + w W by
# source and shift, so that each term is one row slice of one source (see _degree_terms).
_TERMS = ((0, 0, 1), (0, -1, 2), (0, 1, 2), (1, -1, 0), (1, 1, 0))


class _Term(NamedTuple):
    """One term of the step D^{l-1} -> D^l, restricted to the target rows where its kappa is nonzero."""

    source: int  # 0: D^{l-1}, 1: D^{l-1} with reversed rows
    r: int  # row of D^1 that multiplies it
    target: slice  # rows of D^l
    rows: slice  # rows of the source (target row t reads row t + shift - 1)
    kappa_edge: Tensor  # [rows, 1, 1]: kappa times the normalisation of the columns n = ±l


class _DegreeTerms(NamedTuple):
    """Constants of the step D^{l-1} -> D^l, float64, for one degree l >= 2."""

    kappa: Tensor  # [5, 2l+1, 1, 1]: row coefficient of each term, target rows m = -l..l
    col_scale: Tensor  # [2l-1, 1]: normalisation of the columns |n| < l
    terms: tuple[_Term, ...]


@functools.cache
def _degree_terms(l: int, device: torch.device) -> _DegreeTerms:
    """Coefficients of Ivanic & Ruedenberg (J. Phys. Chem. 1996, 100, 6342; erratum 1998, 102, 9099).

    Their u, v, w are ``sqrt(numerator(m) / denominator(n))``; the numerators go into kappa (per target row
    m), the denominators into the column normalisations. In the paper's notation the terms are
    U = P_0(m, n), V = ±P_1(m ∓ 1, n) - P_-1(-m ± 1, n), W = P_1(m ± 1, n) ± P_-1(-m ∓ 1, n) (with the
    special cases m = 0, ±1), and P_-1(-a, n) is row a of the reversed source.
    """
    kappa = np.zeros((len(_TERMS), 2 * l + 1))
    for m in range(-l, l + 1):
        a = abs(m)
        u = math.sqrt((l + m) * (l - m))
        v = 0.5 * math.sqrt((l + a - 1) * (l + a) * (2 if m == 0 else 1)) * (-1 if m == 0 else 1)
        w = -0.5 * math.sqrt((l - a - 1) * (l - a)) if a < l else 0.0  # zero for |m| >= l - 1
        # columns: U, (D^{l-1}, m-1), (D^{l-1}, m+1), (reversed, m-1), (reversed, m+1)
        if m > 0:
            kappa[:, m + l] = (u, v * math.sqrt(2) if m == 1 else v, w, 0.0 if m == 1 else -v, w)
        elif m == 0:
            kappa[:, m + l] = (u, 0.0, v, 0.0, v)
        else:
            kappa[:, m + l] = (u, w, 0.0 if m == -1 else v, -w, v * math.sqrt(2) if m == -1 else v)
    kappa_t = torch.tensor(kappa, dtype=torch.float64, device=device)[:, :, None, None]
    kappa_edge = kappa_t / math.sqrt(2 * l * (2 * l - 1))
    terms = []
    for k, (source, shift, r) in enumerate(_TERMS):
        nonzero = np.flatnonzero(kappa[k])
        t0, t1 = int(nonzero[0]), int(nonzero[-1]) + 1
        # the source rows read by the nonzero span must exist (rows 0..2l-2 of D^{l-1})
        if t0 + shift - 1 < 0 or t1 + shift - 1 > 2 * l - 1:
            raise RuntimeError(f"recurrence term {k} of degree {l} reads outside D^{l - 1}")  # a bug
        terms.append(_Term(source, r, slice(t0, t1), slice(t0 + shift - 1, t1 + shift - 1), kappa_edge[k, t0:t1]))
    n = np.arange(-(l - 1), l)
    return _DegreeTerms(
        kappa=kappa_t,
        col_scale=torch.tensor(1 / np.sqrt((l + n) * (l - n)), dtype=torch.float64, device=device)[:, None],
        terms=tuple(terms),
    )


class _RotationTerms(NamedTuple):
    """Entries of D^1 that multiply the terms, shared by all degrees; float64, poses last."""

    mid: Tensor  # [5, 1, 1, M]: D^1[r, 0] of each term's row r (m = 0 column: columns |n| < l)
    edge_a: Tensor  # [3, 1, 2, M]: per row r, the coefficients of column -(l-1) in columns -l, +l
    edge_b: Tensor  # [3, 1, 2, M]: the same for column l-1


def _rotation_terms(D1: Tensor) -> _RotationTerms:
    """``D1 [3, 3, M]`` (float64, rows and columns m = -1, 0, 1) -> the factors used by every degree."""
    rows = torch.tensor([r for _, _, r in _TERMS], device=D1.device)
    plus, minus = D1[:, 2], D1[:, 0]  # [3, M]: D^1[r, 1], D^1[r, -1]
    # P_r(a, -l) = D^1[r, 1] D[a, -(l-1)] + D^1[r, -1] D[a, l-1] and
    # P_r(a, +l) = D^1[r, 1] D[a, l-1] - D^1[r, -1] D[a, -(l-1)]
    return _RotationTerms(
        mid=D1[:, 1].index_select(0, rows)[:, None, None],
        edge_a=torch.stack([plus, -minus], dim=1).unsqueeze(1),
        edge_b=torch.stack([minus, plus], dim=1).unsqueeze(1),
    )


def _next_degree(l: int, prev: Tensor, rot: _RotationTerms, out: Tensor) -> None:
    """Add D^l to ``out [2l+1, 2l+1, M]`` (zeros) from D^{l-1} ``[2l-1, 2l-1, M]`` (float64, poses last, l >= 2).

    ``D^l[m, n] = sum_k kappa_k[m] P_k(m + shift_k, n)``, where for |n| < l, P_k is the source's entry
    (m + shift_k, n) times D^1[r_k, 0] and the column normalisation, and for n = ±l a combination of its
    columns ±(l-1). Each term is then one fused multiply-add over a row slice, with the poses on the
    last, contiguous axis: a handful of long vectorised ops per degree and no gathers. Everything is a
    polynomial in the entries of D^1, with no division or branch on the input, so it is as exact at the
    identity, at half-turns and at the poles as anywhere else.
    """
    c = _degree_terms(l, prev.device)
    scaled = prev * c.col_scale  # the normalisation of columns |n| < l, applied once to the source
    mid_sources = (scaled, scaled.flip(0))
    ends = prev[:, :: 2 * l - 2]  # columns -(l-1), l-1: [2l-1, 2, M]
    edge = torch.addcmul(ends[None, :, :1] * rot.edge_a, ends[None, :, 1:], rot.edge_b)  # [3, 2l-1, 2, M]
    edge_sources = (edge, edge.flip(1))
    coef = rot.mid * c.kappa  # [5, 2l+1, 1, M]
    out_mid, out_edge = out[:, 1:-1], out[:, :: 2 * l]
    for k, term in enumerate(c.terms):
        out_mid[term.target].addcmul_(mid_sources[term.source][term.rows], coef[k, term.target])
        out_edge[term.target].addcmul_(edge_sources[term.source][term.r, term.rows], term.kappa_edge)


def _wigner_D_low(l: int, R: Tensor) -> Tensor:
    """D^0 = 1 and D^1 = P R Pᵀ, exact in any dtype (no arithmetic at all)."""
    if l == 0:
        return R.new_ones(R.shape[:-2] + (1, 1))
    perm = torch.tensor(_PERM_L1, device=R.device)
    return R.index_select(-2, perm).index_select(-1, perm)


def _higher_degrees(L: int, R: Tensor) -> Iterator[tuple[int, int, list[Tensor]]]:
    """``(start, stop, [D^l for l = 2..L])`` over chunks of the poses ``R [M, 3, 3]``.

    Each D^l is float64 ``[2l+1, 2l+1, stop - start]`` on the work device, poses last, so that every step
    of the recurrence is a few long contiguous elementwise ops. Huge batches go in chunks to bound this
    scratch (all degrees below L plus the temporaries of a step).
    """
    device = _work_device(R.device)
    step = max(1, _CHUNK_BYTES // (2 * 8 * sum((2 * l + 1) ** 2 for l in range(L + 1))))
    for start in range(0, R.shape[0], step):
        R64 = R[start : start + step].to(device=device, dtype=torch.float64)
        M = R64.shape[0]
        D = _wigner_D_low(1, R64).permute(1, 2, 0).contiguous()  # [3, 3, M]
        rot = _rotation_terms(D)
        Ds = []
        for l in range(2, L + 1):
            # zeros, as the terms accumulate; a fresh tensor per degree, which autograd needs
            Ds.append(torch.zeros((2 * l + 1, 2 * l + 1, M), dtype=torch.float64, device=device))
            _next_degree(l, D, rot, Ds[-1])
            D = Ds[-1]
        yield start, start + M, Ds


def _poses_first(flat: Tensor, degrees: list[int], dtype: torch.dtype) -> list[Tensor]:
    """``D^l [M, 2l+1, 2l+1]`` in ``dtype`` for each of ``degrees`` (all >= 2) of the poses ``flat [M, 3, 3]``,
    from one pass of the recurrence up to the highest."""
    outs = [torch.empty((flat.shape[0], 2 * l + 1, 2 * l + 1), dtype=dtype, device=flat.device) for l in degrees]
    if not degrees:
        return outs
    for start, stop, Ds in _higher_degrees(max(degrees), flat):
        for out, l in zip(outs, degrees):
            out[start:stop] = Ds[l - 2].to(dtype).permute(2, 0, 1)  # cast while contiguous, then poses to the front
    return outs


# ----------------------------------------------------------------------------------------------------
# public API: Wigner-D


def wigner_D(l: int, R: Tensor) -> Tensor:
    """Real orthogonal Wigner-D matrix of degree ``l``: ``R [..., 3, 3] -> [..., 2l+1, 2l+1]``.

    A homomorphism (``wigner_D(l, R1 @ R2) == wigner_D(l, R1) @ wigner_D(l, R2)``) in the real basis
    m = -l..l of :func:`spherical_harmonics`; ``wigner_D(0, R) == 1`` and ``wigner_D(1, R) == P R Pᵀ``.
    Polynomial in R's entries, computed in float64, returned in R's dtype and on R's device. Inputs that
    are rotations only up to rounding (float32, say) give results accurate to that rounding.
    """
    l = _check_degree(l)
    _check_rotations(R)
    if l <= 1:
        return _wigner_D_low(l, R)
    (out,) = _poses_first(R.reshape(-1, 3, 3), [l], R.dtype)
    return out.reshape(R.shape[:-2] + out.shape[-2:])


def wigner_D_list(L: int, R: Tensor) -> list[Tensor]:
    """Every degree up to ``L`` from one pass of the recurrence: ``R [..., 3, 3] -> [D^0, ..., D^L]``,
    ``D^l [..., 2l+1, 2l+1]`` in R's dtype and device (``[l] == wigner_D(l, R)``).

    For consumers that apply the degrees block by block; :func:`wigner_D_blocks` assembles them into one
    dense block-diagonal matrix instead, which for L = 7 is mostly the 83% of zeros around the blocks.
    """
    L = _check_degree(L, "L")
    _check_rotations(R)
    flat = R.reshape(-1, 3, 3)
    low = [_wigner_D_low(l, flat) for l in range(min(L, 1) + 1)]
    high = _poses_first(flat, list(range(2, L + 1)), R.dtype)
    return [D.reshape(R.shape[:-2] + D.shape[-2:]) for D in low + high]


def wigner_D_blocks(L: int, R: Tensor) -> Tensor:
    """Block-diagonal ``D^0 ⊕ D^1 ⊕ ... ⊕ D^L``: ``R [..., 3, 3] -> [..., (L+1)^2, (L+1)^2]``.

    The unitary representation of SO(3)-RoPE (each degree once). All degrees come out of one pass of the
    recurrence; off-diagonal blocks are exactly zero.
    """
    L = _check_degree(L, "L")
    _check_rotations(R)
    flat = R.reshape(-1, 3, 3)
    d = (L + 1) ** 2
    # Allocate in the caller's dtype: the output is mostly zeros, so never materialise it in float64.
    out = torch.zeros((flat.shape[0], d, d), dtype=R.dtype, device=R.device)
    out[:, 0, 0] = 1
    if L >= 1:
        out[:, 1:4, 1:4] = _wigner_D_low(1, flat)
    for start, stop, Ds in _higher_degrees(L, flat):
        for l, D in enumerate(Ds, start=2):
            # cast while contiguous, so that the transposing copy moves fewer bytes
            out[start:stop, l * l : (l + 1) ** 2, l * l : (l + 1) ** 2] = D.to(R.dtype).permute(2, 0, 1)
    return out.reshape(R.shape[:-2] + (d, d))


def spherical_harmonics(l: int, x: Tensor) -> Tensor:
    """Real spherical harmonics of degree ``l`` at the directions ``x [..., 3] -> [..., 2l+1]``.

    The basis that :func:`wigner_D` acts on: ``spherical_harmonics(l, R @ x) == wigner_D(l, R) @
    spherical_harmonics(l, x)``. ``x`` is normalised first (a zero vector gives NaN); orthonormal on S^2.
    """
    l = _check_degree(l)
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != 3 or not x.is_floating_point():
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"expected x as a floating-point tensor of shape [..., 3], got {got}")
    device = _work_device(x.device)
    pts = x.reshape(-1, 3).to(device=device, dtype=torch.float64)
    pts = pts / pts.norm(dim=-1, keepdim=True)
    y = _solid_harmonics(l, pts.T.contiguous())[l].T  # [K, 2l+1]
    return y.to(device=x.device, dtype=x.dtype).reshape(x.shape[:-1] + (2 * l + 1,))


# ----------------------------------------------------------------------------------------------------
# public API: rotation utilities


def _float_tensors(*xs: Tensor | float) -> list[Tensor]:
    """Broadcast tensors and Python numbers to one floating dtype and device.

    Like torch's own promotion, Python numbers do not pick the dtype: they are converted straight to
    the tensors' dtype (so ``math.pi`` next to a float64 tensor stays float64 pi, not float32 pi).
    """
    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors], tensors[0].dtype) if tensors else None
    if dtype is None or not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    device = next((t.device for t in tensors if t.dim() > 0), tensors[0].device if tensors else None)
    return list(torch.broadcast_tensors(*[torch.as_tensor(x, dtype=dtype, device=device) for x in xs]))


def euler_zyz_to_matrix(alpha: Tensor | float, beta: Tensor | float, gamma: Tensor | float) -> Tensor:
    """``R = Rz(alpha) Ry(beta) Rz(gamma)``; angles broadcast to ``[...]`` -> ``[..., 3, 3]``."""
    a, b, g = _float_tensors(alpha, beta, gamma)
    ca, sa, cb, sb, cg, sg = a.cos(), a.sin(), b.cos(), b.sin(), g.cos(), g.sin()
    rows = [
        ca * cb * cg - sa * sg, -ca * cb * sg - sa * cg, ca * sb,
        sa * cb * cg + ca * sg, -sa * cb * sg + ca * cg, sa * sb,
        -sb * cg, sb * sg, cb,
    ]  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(a.shape + (3, 3))


def matrix_to_euler_zyz(R: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """ZYZ Euler angles of ``R [..., 3, 3]``: ``(alpha, beta, gamma)``, each ``[...]``.

    ``alpha, gamma`` in [-pi, pi), ``beta`` in [0, pi]; at the poles (beta = 0 or pi, where only
    alpha ± gamma is defined) ``gamma = 0`` and beta is exactly 0 or pi. Accurate everywhere, near the
    poles included: each angle is read from the entries it actually controls (see the comments).
    """
    _check_rotations(R)
    tol = 8 * torch.finfo(R.dtype).eps  # sin(beta) below this: a pole within the input's precision
    r = R.to(torch.float64)

    def e(i: int, j: int) -> Tensor:
        return r[..., i, j]

    sin_b = 0.5 * (torch.hypot(e(0, 2), e(1, 2)) + torch.hypot(e(2, 0), e(2, 1)))
    beta = torch.atan2(sin_b, e(2, 2))
    # (R02, R12) = sin(b) (cos a, sin a): alpha to relative accuracy eps / sin(b), which is all the
    # entries it multiplies need. gamma must not come from the third row the same way: near a pole the
    # upper-left block depends on alpha + gamma at full weight. So take the sum (or difference) from
    # that block, where it is scaled by 1 + cos(b) (or 1 - cos(b)), and subtract alpha:
    # R00 + R11 = (1 + cb) cos(a + g), R10 - R01 = (1 + cb) sin(a + g),
    # R11 - R00 = (1 - cb) cos(a - g), -(R10 + R01) = (1 - cb) sin(a - g).
    alpha = torch.atan2(e(1, 2), e(0, 2))
    s = torch.atan2(e(1, 0) - e(0, 1), e(0, 0) + e(1, 1))
    d = torch.atan2(-(e(1, 0) + e(0, 1)), e(1, 1) - e(0, 0))
    gamma = torch.where(e(2, 2) >= 0, s - alpha, alpha - d)
    # At a pole only alpha ± gamma is defined: choose gamma = 0 and snap beta.
    north, south = (sin_b <= tol) & (e(2, 2) > 0), (sin_b <= tol) & (e(2, 2) < 0)
    alpha = torch.where(north, s, torch.where(south, d, alpha))
    gamma = torch.where(north | south, torch.zeros_like(gamma), gamma)
    beta = torch.where(north, torch.zeros_like(beta), torch.where(south, torch.full_like(beta, math.pi), beta))

    def wrap(t: Tensor) -> Tensor:
        return torch.remainder(t + math.pi, 2 * math.pi) - math.pi

    return wrap(alpha).to(R.dtype), beta.to(R.dtype), wrap(gamma).to(R.dtype)


def _quaternion_to_matrix(q: Tensor) -> Tensor:
    """Unit quaternions ``(w, x, y, z) [..., 4] -> [..., 3, 3]``."""
    w, x, y, z = q.unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
        2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
        2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y),
    ]  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(q.shape[:-1] + (3, 3))


def random_rotations(
    n: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor:
    """``n`` Haar-uniform rotations ``[n, 3, 3]`` (normalised Gaussian quaternions are uniform on S^3)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"expected n to be a non-negative int, got {n!r}")
    # draw where the generator lives (a CPU generator cannot fill a CUDA tensor), then move
    q = torch.randn((int(n), 4), generator=generator, dtype=dtype, device=generator.device if generator else device)
    return _quaternion_to_matrix(q / q.norm(dim=-1, keepdim=True)).to(device)


def rotation_angle(R: Tensor) -> Tensor:
    """Rotation angle in [0, pi] of ``R [..., 3, 3] -> [...]``.

    ``atan2(sin, cos)`` with sin from the antisymmetric part and cos = (trace - 1) / 2: accurate near 0
    and near pi, where ``acos`` of the trace alone loses half the digits.
    """
    _check_rotations(R)
    r = R.to(torch.float64)
    axis = torch.stack([r[..., 2, 1] - r[..., 1, 2], r[..., 0, 2] - r[..., 2, 0], r[..., 1, 0] - r[..., 0, 1]], dim=-1)
    cos = (r.diagonal(dim1=-2, dim2=-1).sum(-1) - 1) / 2
    return torch.atan2(axis.norm(dim=-1) / 2, cos).to(R.dtype)


def axis_angle_to_matrix(axis: Tensor, angle: Tensor | float) -> Tensor:
    """Rodrigues: rotation by ``angle [...]`` about ``axis [..., 3]`` (normalised here) -> ``[..., 3, 3]``."""
    if not isinstance(axis, torch.Tensor) or axis.dim() < 1 or axis.shape[-1] != 3:
        got = list(axis.shape) if isinstance(axis, torch.Tensor) else type(axis).__name__
        raise ValueError(f"expected axis of shape [..., 3], got {got}")
    x, y, z, angle = _float_tensors(*axis.unbind(-1), angle)
    norm = torch.sqrt(x * x + y * y + z * z)
    if bool((norm == 0).any()):
        raise ValueError("expected a nonzero rotation axis, got a zero vector")
    x, y, z = x / norm, y / norm, z / norm
    c, s = angle.cos(), angle.sin()
    t = 1 - c
    rows = [
        c + t * x * x, t * x * y - s * z, t * x * z + s * y,
        t * x * y + s * z, c + t * y * y, t * y * z - s * x,
        t * x * z - s * y, t * y * z + s * x, c + t * z * z,
    ]  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(x.shape + (3, 3))
