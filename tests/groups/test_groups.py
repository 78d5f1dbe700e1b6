"""The group-theory core, checked on every group (escnn's checker, without escnn)."""

import itertools

import numpy as np
import pytest

from eqvit.groups import Representation, get_group, list_groups
from eqvit.groups.irreps import Irrep

ATOL = 1e-10


def test_elements_orthogonal_identity_first(group):
    d = group.dim
    assert np.allclose(group.elements[0], np.eye(d), atol=0)
    gram = np.einsum("gji,gjk->gik", group.elements, group.elements)
    assert np.abs(gram - np.eye(d)).max() < ATOL
    # distinct elements
    flat = group.elements.reshape(group.order, -1)
    dists = np.abs(flat[:, None] - flat[None]).max(-1) + np.eye(group.order)
    assert dists.min() > 1e-6


def test_cayley_table(group):
    prod = np.einsum("iab,jbc->ijac", group.elements, group.elements)
    assert np.abs(prod - group.elements[group.cayley]).max() < ATOL
    # Latin square: every row and column is a permutation
    for row in group.cayley:
        assert sorted(row) == list(range(group.order))
    for col in group.cayley.T:
        assert sorted(col) == list(range(group.order))
    # associativity
    C = group.cayley
    assert np.array_equal(
        C[C[:, :, None], np.arange(group.order)[None, None, :]][:, :, :],
        C[np.arange(group.order)[:, None, None], C[None, :, :]],
    )


def test_inverse(group):
    assert np.all(group.cayley[np.arange(group.order), group.inverse] == 0)
    assert np.all(group.cayley[group.inverse, np.arange(group.order)] == 0)


def test_conjugacy_classes_partition(group):
    members = np.concatenate(group.conjugacy_classes)
    assert sorted(members.tolist()) == list(range(group.order))
    assert group.conjugacy_classes[0].tolist() == [0]
    # class sizes divide the order
    for cls in group.conjugacy_classes:
        assert group.order % len(cls) == 0


def test_irreps_are_homomorphisms(group):
    for rho in group.irreps:
        lhs = rho.matrices[group.cayley]  # rho(gh)
        rhs = np.einsum("gab,hbc->ghac", rho.matrices, rho.matrices)
        assert np.abs(lhs - rhs).max() < ATOL, rho


def test_irreps_orthogonal(group):
    for rho in group.irreps:
        gram = np.einsum("gji,gjk->gik", rho.matrices, rho.matrices)
        assert np.abs(gram - np.eye(rho.dim)).max() < ATOL, rho


def test_irreps_irreducible_and_typed(group):
    factor = {"real": 1, "complex": 2, "quaternionic": 4}
    for rho in group.irreps:
        norm = rho.character @ rho.character / group.order
        assert abs(norm - factor[rho.type]) < 1e-9, rho
        # The commutant dimension equals the type factor (independent check of the type).
        assert len(rho.endomorphism_basis) == factor[rho.type], rho


def test_irreps_inequivalent_and_complete(group):
    chars = group.character_table
    gram = chars @ chars.T / group.order
    factors = np.array([rho.type_factor for rho in group.irreps])
    assert np.abs(gram - np.diag(factors)).max() < 1e-9
    total = sum(rho.dim**2 / rho.type_factor for rho in group.irreps)
    assert total == pytest.approx(group.order)
    assert group.irreps[0].is_trivial


@pytest.mark.parametrize(
    "name, expected",
    [
        ("C1", [("A", 1, "real")]),
        ("C4", [("A", 1, "real"), ("B", 1, "real"), ("E1", 2, "complex")]),
        ("C5", [("A", 1, "real"), ("E1", 2, "complex"), ("E2", 2, "complex")]),
        ("D1", [("A1", 1, "real"), ("A2", 1, "real")]),
        ("D3", [("A1", 1, "real"), ("A2", 1, "real"), ("E1", 2, "real")]),
        (
            "D6",
            [
                ("A1", 1, "real"),
                ("A2", 1, "real"),
                ("B1", 1, "real"),
                ("B2", 1, "real"),
                ("E1", 2, "real"),
                ("E2", 2, "real"),
            ],
        ),
        ("T", [("A", 1, "real"), ("E", 2, "complex"), ("T", 3, "real")]),
        ("O", [("A1", 1, "real"), ("A2", 1, "real"), ("E", 2, "real"), ("T1", 3, "real"), ("T2", 3, "real")]),
        ("I", [("A", 1, "real"), ("T1", 3, "real"), ("T2", 3, "real"), ("G", 4, "real"), ("H", 5, "real")]),
    ],
)
def test_irrep_names(name, expected):
    assert [(r.name, r.dim, r.type) for r in get_group(name).irreps] == expected


@pytest.mark.parametrize("name", ["T", "O", "I"])
def test_natural_irrep_is_the_rotation_matrices(name):
    G = get_group(name)
    natural = next(r for r in G.irreps if r.name in ("T", "T1"))
    assert np.array_equal(natural.matrices, G.elements)
    assert np.allclose(np.linalg.det(G.elements), 1.0)


def test_closed_form_planar_irreps_follow_the_seed():
    """Prop. 2: rho_E1(r) = R(2 pi/n), rho_E(t) = diag(1, -1); A2(t) = -1, B1(r) = -1, B2(t) = -1."""
    G = get_group("D4")
    r, t = 1, 4  # indices of r and t (r^k t^s at k + n s)
    assert np.allclose(G.elements[r], [[0, -1], [1, 0]], atol=1e-15)
    assert np.allclose(G.elements[t], np.diag([1, -1]))
    irr = {rho.name: rho for rho in G.irreps}
    assert np.allclose(irr["E1"](r), G.elements[r]) and np.allclose(irr["E1"](t), np.diag([1, -1]))
    assert irr["A2"](t)[0, 0] == -1 and irr["A2"](r)[0, 0] == 1
    assert irr["B1"](r)[0, 0] == -1 and irr["B1"](t)[0, 0] == 1
    assert irr["B2"](r)[0, 0] == -1 and irr["B2"](t)[0, 0] == -1


@pytest.mark.parametrize(
    "name, count", [("C4", 3), ("C6", 4), ("D4", 8), ("D6", 10), ("D3", 4), ("T", 5), ("O", 11), ("I", 9)]
)
def test_subgroups_up_to_conjugacy(name, count):
    G = get_group(name)
    subs = G.subgroups()
    assert len(subs) == count
    for H in subs:
        assert np.array_equal(G.closure(H), H)
    # no two representatives are conjugate
    for a, b in itertools.combinations(subs, 2):
        if len(a) == len(b):
            assert all(not np.array_equal(G.conjugate_subgroup(a, g), b) for g in range(G.order))


def _by_stabilizer(G, generators):
    return G.homogeneous_space(G.closure(generators))


# The seed's Table 2 (D4) and Table 3 (D6): stabilizer generators (as r^k t^s indices k + n s)
# and the multiplicities of (A1, A2, B1, B2, E1[, E2]).
TABLE_2 = [
    ([], (1, 1, 1, 1, 2), 8),
    ([2], (1, 1, 1, 1, 0), 4),
    ([1], (1, 1, 0, 0, 0), 2),
    ([4], (1, 0, 1, 0, 1), 4),
    ([4 + 1], (1, 0, 0, 1, 1), 4),
    ([4, 2], (1, 0, 1, 0, 0), 2),
    ([4 + 1, 2], (1, 0, 0, 1, 0), 2),
    ([4, 1], (1, 0, 0, 0, 0), 1),
]
TABLE_3 = [
    ([], (1, 1, 1, 1, 2, 2), 12),
    ([3], (1, 1, 0, 0, 0, 2), 6),
    ([2], (1, 1, 1, 1, 0, 0), 4),
    ([1], (1, 1, 0, 0, 0, 0), 2),
    ([6], (1, 0, 1, 0, 1, 1), 6),
    ([6 + 1], (1, 0, 0, 1, 1, 1), 6),
    ([6, 3], (1, 0, 0, 0, 0, 1), 3),
    ([6, 2], (1, 0, 1, 0, 0, 0), 2),
    ([6 + 1, 2], (1, 0, 0, 1, 0, 0), 2),
    ([6, 1], (1, 0, 0, 0, 0, 0), 1),
]


@pytest.mark.parametrize("gens, mult, size", TABLE_2)
def test_table_2_d4(gens, mult, size):
    X = _by_stabilizer(get_group("D4"), gens)
    assert X.size == size
    assert tuple(X.multiplicities.values()) == mult


@pytest.mark.parametrize("gens, mult, size", TABLE_3)
def test_table_3_d6(gens, mult, size):
    X = _by_stabilizer(get_group("D6"), gens)
    assert X.size == size
    assert tuple(X.multiplicities.values()) == mult


def test_d3_example():
    """The seed's D3 example: C(D3/<t>) = A1 + E1 (3 points), C(D3/<r>) = A1 + A2."""
    G = get_group("D3")
    assert _by_stabilizer(G, [3]).multiplicities == {"A1": 1, "A2": 0, "E1": 1}
    assert _by_stabilizer(G, [1]).multiplicities == {"A1": 1, "A2": 1, "E1": 0}
    assert _by_stabilizer(G, []).multiplicities == {"A1": 1, "A2": 1, "E1": 2}


def test_homogeneous_space_fourier_basis(group):
    for H in group.subgroups():
        X = group.homogeneous_space(H)
        Q = X.fourier_basis
        assert np.abs(Q.T @ Q - np.eye(X.size)).max() < 1e-9
        # P(g) Q = Q blockdiag(rho(g)): the FT intertwines the permutation representation.
        lhs = np.einsum("gab,bc->gac", X.permutation_matrices, Q)
        rhs = np.einsum("ab,gbc->gac", Q, X.representation.block_diagonal)
        assert np.abs(lhs - rhs).max() < 1e-9
        # permutations compose like the group: perm(gh) = perm(g) o perm(h); H stabilizes point 0
        P = X.permutations
        composed = P[:, P]  # composed[g, h, x] = P[g][P[h][x]]
        assert np.array_equal(P[group.cayley], composed)
        assert sorted(np.flatnonzero(P[:, 0] == 0).tolist()) == H.tolist()


def test_regular_representation(group):
    reg = group.regular_representation
    assert reg.dim == group.order
    for rho in group.irreps:
        assert reg.multiplicities[rho.name] == rho.dim // rho.type_factor
    assert np.allclose(reg.character, np.eye(group.order)[0] * group.order)


def test_representation_direct_sum_and_change_of_basis(group):
    rho = group.irreps[-1]
    rep = Representation(group, [rho, group.irreps[0], rho])
    Q = np.linalg.qr(np.random.default_rng(1).standard_normal((rep.dim, rep.dim)))[0]
    moved = rep.change_basis(Q)
    assert np.allclose(moved.character, rep.character)
    lhs = moved.matrices[group.cayley]
    rhs = np.einsum("gab,hbc->ghac", moved.matrices, moved.matrices)
    assert np.abs(lhs - rhs).max() < 1e-9
    # decomposing the moved matrices recovers the multiplicities
    again = Representation.from_matrices(group, moved.matrices)
    assert again.multiplicities == rep.multiplicities
    assert np.abs(again.matrices - moved.matrices).max() < 1e-9
    assert (rep + group.regular_representation).dim == rep.dim + group.order


@pytest.mark.parametrize("name", ["D4", "D6", "O", "I"])
def test_restriction_multiplicities(name):
    """Theorem 2 of the O(2) seed: Res^G_H of each irrep, counted by characters."""
    G = get_group(name)
    for H_idx in G.subgroups():
        H = G.subgroup(H_idx)
        assert np.allclose(H.elements, G.elements[H.parent_indices])
        for rho in G.irreps:
            res = Representation(G, [rho]).restrict(H)
            assert res.dim == rho.dim
            assert np.abs(res.matrices - rho.matrices[H.parent_indices]).max() < 1e-9
            for sigma in H.irreps:
                expected = round(
                    rho.character[H.parent_indices] @ sigma.character / (sigma.character @ sigma.character)
                )
                assert res.multiplicities[sigma.name] == expected


def test_planar_subgroups_get_seed_names():
    G = get_group("D4")
    names = sorted(G.subgroup(H).name for H in G.subgroups())
    assert names == sorted(["C1", "C2", "C4", "D1", "D1[45deg]", "D2", "D2[45deg]", "D4"])
    H = G.subgroup(G.closure([4 + 1]))  # <tr>: reflection across the 45 degree axis
    assert [r.name for r in H.irreps] == ["A1", "A2"]


def test_get_group_errors():
    with pytest.raises(ValueError, match="Valid forms"):
        get_group("D0")
    with pytest.raises(ValueError, match="Did you mean 'O'"):
        get_group("o")
    with pytest.raises(ValueError):
        get_group(4)
    assert get_group("trivial").order == 1
    assert "I" in list_groups() and "D4" in list_groups()


def test_irrep_validation():
    with pytest.raises(ValueError, match="reducible"):
        Irrep("bad", np.stack([np.eye(2), np.eye(2)]))
    with pytest.raises(ValueError, match="unknown irrep"):
        get_group("D4").irrep("E3")
