"""The canonical invariant APE basis.

``invariant_basis`` must span exactly the invariants (the image of the group-averaged projector, built
here from its definition), be orthonormal, and be the same array on every numpy/LAPACK build: it calls
no LAPACK routine (checked by making them raise) and its layout is the documented one (checked against
the hand-derived basis of the standard representation). A state dict without ``basis_version`` holds
coefficients in this build's legacy eigh basis; loading it must give the encoding the old code computed.
"""

from __future__ import annotations

import numpy as np
import pytest

from eqvit.geometry.hexagonal import HexPatchGrid
from eqvit.geometry.points import permutations_for
from eqvit.geometry.square import square_grid
from eqvit.groups import get_group
from eqvit.models.restrict import find_subgroup
from eqvit.nn.posenc.invariant import invariant_basis

SQUARE_ODD, SQUARE_EVEN = square_grid(5, 5), square_grid(6, 6)  # with and without a centre point
HEX = HexPatchGrid(3, 2).patch_centers  # 19 centres: the origin, a ring of 6, a ring of 12
CASES = [
    ("D4", "D4", SQUARE_ODD),
    ("D4", "D4", SQUARE_EVEN),
    ("D4", "C4", SQUARE_ODD),
    ("D4", "D2", SQUARE_EVEN),
    ("D4", "D1[45deg]", SQUARE_ODD),
    ("D4", "C1", SQUARE_ODD),
    ("D6", "D6", HEX),
    ("D6", "C6", HEX),
    ("D6", "D3", HEX),
    ("D6", "D1[30deg]", HEX),
]
IDS = [f"{g}>{h}-{len(c)}" for g, h, c in CASES]
LAPACK = ("eigh", "eigvalsh", "eig", "eigvals", "qr", "svd", "lstsq", "solve", "inv", "pinv", "cholesky", "det")


def _group_and_perms(group: str, subgroup: str, centers: np.ndarray):
    H = find_subgroup(get_group(group), subgroup)
    return H, permutations_for(centers, H.elements)


def _projector(perms: np.ndarray, matrices: np.ndarray) -> np.ndarray:
    """``[M d, M d]`` the group average of ``p -> g . p``, ``(g . p)(perms[g, a]) = rho(g) p(a)``."""
    order, M = perms.shape
    total = 0
    for g in range(order):
        moves = np.zeros((M, M))
        moves[perms[g], np.arange(M)] = 1.0
        total = total + np.kron(moves, matrices[g])
    return total / order


@pytest.mark.parametrize(("group", "subgroup", "centers"), CASES, ids=IDS)
def test_the_basis_is_orthonormal_invariant_and_spans_the_invariants(group, subgroup, centers):
    H, perms = _group_and_perms(group, subgroup, centers)
    dims = []
    for rho in H.irreps:
        B = invariant_basis(perms, rho.matrices)
        n, M, d = len(B), len(centers), rho.dim
        assert B.shape == (n, M, d)
        flat = B.reshape(n, M * d)
        P = _projector(perms, rho.matrices)
        assert n == round(np.trace(P))
        np.testing.assert_allclose(flat @ flat.T, np.eye(n), atol=1e-13)
        np.testing.assert_allclose(P @ flat.T, flat.T, atol=1e-13)  # in the image, and as many as its rank
        for g in range(H.order):  # p(g a) = rho(g) p(a), i.e. rho(g) p(g^-1 a) = p(a)
            np.testing.assert_allclose(B[:, perms[g]], np.einsum("ij,kmj->kmi", rho.matrices[g], B), atol=1e-13)
        dims.append(n)
    assert max(dims) > 1  # a degenerate eigenspace, where eigh's choice was arbitrary


def _expected_standard_basis(perms: np.ndarray, elements: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """The basis the construction promises for the standard representation ``rho(g) = g``, derived by hand.

    Orbits by smallest index ``a0``; the stabiliser of ``a0 != 0`` is trivial (fixed space R^2: ``e_1``,
    ``e_2``) or one reflection (fixed line through ``a0``: ``a0 / |a0|`` with the sign of ``P e_i`` for the
    first ``e_i`` not orthogonal to it); at the origin it fixes nothing. ``p(g a0) = g p(a0)``, unit norm.
    """
    vectors = []
    for a0 in range(len(centers)):
        orbit = np.unique(perms[:, a0])
        if orbit[0] != a0:
            continue
        stabiliser = np.flatnonzero(perms[:, a0] == a0)
        if len(stabiliser) == 1:  # (C1 at the origin too)
            fixed = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
        elif len(stabiliser) == 2 and np.linalg.norm(centers[a0]) > 0:
            u = centers[a0] / np.linalg.norm(centers[a0])
            first = u[np.flatnonzero(np.abs(u) > 1e-9)[0]]
            fixed = [np.sign(first) * u]
        else:
            assert np.linalg.norm(centers[a0]) == 0  # the origin, whose stabiliser holds a rotation
            fixed = []
        for v in fixed:
            p = np.zeros((len(centers), 2))
            for b in orbit:
                g = np.flatnonzero(perms[:, a0] == b)[0]
                p[b] = elements[g] @ v
            vectors.append(p / np.sqrt(len(orbit)))
    return np.array(vectors)


STANDARD = [0, 2, 5, 6]  # the hand derivation's cases: C1, or an origin (if any) fixed by a rotation


@pytest.mark.parametrize(("group", "subgroup", "centers"), [CASES[i] for i in STANDARD], ids=[IDS[i] for i in STANDARD])
def test_the_basis_of_the_standard_representation_is_the_documented_one(group, subgroup, centers):
    H, perms = _group_and_perms(group, subgroup, centers)
    B = invariant_basis(perms, H.elements)  # rho(g) = g: the irrep E1 of C4, D4 and D6
    np.testing.assert_allclose(B, _expected_standard_basis(perms, H.elements, centers), atol=1e-14)


def test_the_basis_is_bitwise_deterministic_and_uses_no_lapack(monkeypatch):
    reference = []
    for group, subgroup, centers in CASES:
        H, perms = _group_and_perms(group, subgroup, centers)
        for rho in H.irreps:
            first = invariant_basis(perms, rho.matrices)
            assert first.tobytes() == invariant_basis(perms, rho.matrices).tobytes()
            reference.append((perms, rho.matrices, first))

    def refuse(*args, **kwargs):
        raise AssertionError("a LAPACK routine decided part of the basis")

    for name in LAPACK:
        monkeypatch.setattr(np.linalg, name, refuse)
    with pytest.raises(AssertionError, match="LAPACK"):  # the patch bites
        np.linalg.eigh(np.eye(2))
    for perms, matrices, first in reference:
        assert invariant_basis(perms, matrices).tobytes() == first.tobytes()


@pytest.mark.parametrize(
    ("perms", "matrices", "message"),
    [
        (np.array([[0, 1], [0, 0]]), np.stack([np.eye(1)] * 2), "permutation"),
        (np.array([[0, 1], [1, 0]]), np.stack([np.eye(1)] * 3), r"shape \[2, d, d\]"),
        (np.array([[0, 1], [1, 0]]), np.ones((2, 1, 2)), r"shape \[2, d, d\]"),
        (np.array([0.0, 1.0]), np.stack([np.eye(1)] * 2), r"integer permutations of shape \[order, M\]"),
    ],
)
def test_bad_input_is_a_value_error(perms, matrices, message):
    with pytest.raises(ValueError, match=message):
        invariant_basis(perms, matrices)
