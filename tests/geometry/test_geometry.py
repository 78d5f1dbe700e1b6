"""Tests for eqvit.geometry: icospheres, hexagonal / square grids, and point permutations.

Group elements are built here from their definitions (D_n: r = R(2 pi / n), t = diag(1, -1);
I: closure of Rz(2 pi / 5) and the 2 pi / 5 turn about vertex 1), and the icosahedral group of
``eqvit.groups`` is preferred when it imports, so the tests pin the shared orientation.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from eqvit.geometry import (
    HexPatchGrid,
    PointIndex,
    hexagon_lattice_coords,
    hexagon_points,
    icosphere,
    permutations_for,
    point_permutation,
    square_grid,
)

LEVELS = range(6)
SQRT5 = np.sqrt(5.0)


# ----------------------------------------------------------------------------- group elements


def _rotation_2d(theta: float) -> np.ndarray:
    return np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])


def _dihedral(n: int) -> np.ndarray:
    """``[2n, 2, 2]``: r^k t^s with r = R(2 pi / n), t = diag(1, -1)."""
    t = np.diag([1.0, -1.0])
    rot = [np.linalg.matrix_power(_rotation_2d(2 * np.pi / n), k) for k in range(n)]
    return np.stack(rot + [r @ t for r in rot])


def _axis_angle(axis, angle: float) -> np.ndarray:
    u = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    K = np.array([[0, -u[2], u[1]], [u[2], 0, -u[0]], [-u[1], u[0], 0]])
    return np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K


def _closure(generators: list[np.ndarray]) -> np.ndarray:
    elements = [np.eye(len(generators[0]))]
    frontier = list(elements)
    while frontier:
        new = []
        for x, g in itertools.product(frontier, generators):
            y = g @ x
            if not any(np.abs(y - e).max() < 1e-9 for e in elements):
                elements.append(y)
                new.append(y)
        frontier = new
    return np.stack(elements)


def _icosahedral_rotations() -> np.ndarray:
    """The 60 rotations of I in the icosphere's orientation (from eqvit.groups when available)."""
    try:
        from eqvit.groups import get_group

        return np.asarray(get_group("I").elements, dtype=np.float64)
    except (ImportError, AttributeError, ValueError):
        vertex1 = np.array([2 / SQRT5, 0.0, 1 / SQRT5])
        return _closure([_axis_angle([0, 0, 1], 2 * np.pi / 5), _axis_angle(vertex1, 2 * np.pi / 5)])


ICOSAHEDRAL = _icosahedral_rotations()
D6 = _dihedral(6)
D4 = _dihedral(4)


def _deviation(points: np.ndarray, matrix: np.ndarray, perm: np.ndarray) -> float:
    return float(np.abs(points[perm] - points @ matrix.T).max())


# ----------------------------------------------------------------------------- icosphere


@pytest.mark.parametrize("level", LEVELS)
def test_icosphere_counts(level):
    s = icosphere(level)
    assert s.num_vertices == len(s.vertices) == 10 * 4**level + 2
    assert s.num_faces == len(s.faces) == 20 * 4**level
    assert s.vertices.shape == (s.num_vertices, 3) and s.vertices.dtype == np.float64
    assert s.faces.shape == (s.num_faces, 3) and s.faces.dtype == np.int64
    assert s.vertex_areas.shape == (s.num_vertices,)
    assert s.face_areas.shape == (s.num_faces,)
    assert s.face_centroids.shape == (s.num_faces, 3)


def test_icosphere_base_orientation():
    """Level 0 is the icosahedron with the vertex order written in the spec (and eqvit.groups)."""
    k = np.arange(5)
    upper = np.stack(
        [2 / SQRT5 * np.cos(2 * np.pi * k / 5), 2 / SQRT5 * np.sin(2 * np.pi * k / 5), np.full(5, 1 / SQRT5)],
        1,
    )
    lower = np.stack(
        [
            2 / SQRT5 * np.cos(2 * np.pi * (k + 0.5) / 5),
            2 / SQRT5 * np.sin(2 * np.pi * (k + 0.5) / 5),
            np.full(5, -1 / SQRT5),
        ],
        1,
    )
    expected = np.concatenate([[[0, 0, 1]], upper, lower, [[0, 0, -1]]])
    np.testing.assert_allclose(icosphere(0).vertices, expected, atol=1e-15, rtol=0)
    # Icosahedron: every vertex has 5 neighbours at the edge length 4 / sqrt(10 + 2 sqrt5).
    dist = np.linalg.norm(expected[:, None] - expected[None], axis=-1)
    edge = 4 / np.sqrt(10 + 2 * SQRT5)
    assert np.all(np.sum(np.abs(dist - edge) < 1e-12, axis=1) == 5)


@pytest.mark.parametrize("level", LEVELS)
def test_icosphere_mesh(level):
    s = icosphere(level)
    np.testing.assert_allclose(np.linalg.norm(s.vertices, axis=1), 1.0, atol=1e-15, rtol=0)
    corners = s.vertices[s.faces]
    assert np.linalg.det(corners).min() > 0, "faces must be outward counter-clockwise"
    # Closed, consistently oriented 2-manifold: every directed edge appears once, its reverse once.
    a, b = s.faces.reshape(-1), np.roll(s.faces, -1, axis=1).reshape(-1)
    directed = set(zip(a.tolist(), b.tolist()))
    assert len(directed) == len(a)
    assert all((j, i) in directed for i, j in directed)
    assert s.num_vertices - len(a) // 2 + s.num_faces == 2  # Euler characteristic
    np.testing.assert_allclose(np.linalg.norm(s.face_centroids, axis=1), 1.0, atol=1e-15, rtol=0)
    # Each centroid lies inside its own face: on the positive side of all three edge planes.
    for k in range(3):
        normal = np.cross(corners[:, k], corners[:, (k + 1) % 3])
        assert np.einsum("fi,fi->f", normal, s.face_centroids).min() > 0


@pytest.mark.parametrize("level", LEVELS)
def test_icosphere_areas(level):
    s = icosphere(level)
    assert s.vertex_areas.min() > 0 and s.face_areas.min() > 0
    assert abs(s.vertex_areas.sum() - 4 * np.pi) < 1e-10
    assert abs(s.face_areas.sum() - 4 * np.pi) < 1e-10
    # Vertex weights are one third of the adjacent faces' areas.
    expected = np.zeros(s.num_vertices)
    np.add.at(expected, s.faces.reshape(-1), np.repeat(s.face_areas / 3, 3))
    np.testing.assert_allclose(s.vertex_areas, expected, rtol=1e-12)
    if level == 0:
        np.testing.assert_allclose(s.face_areas, 4 * np.pi / 20, rtol=1e-13)
        np.testing.assert_allclose(s.vertex_areas, 4 * np.pi / 12, rtol=1e-13)


@pytest.mark.parametrize("level", range(5))
def test_icosphere_hierarchical_order(level):
    parent, child = icosphere(level), icosphere(level + 1)
    assert np.array_equal(child.vertices[: parent.num_vertices], parent.vertices)
    v = parent.vertices[parent.faces]  # [F, 3, 3] corners v0, v1, v2

    def mid(p, q):
        m = p + q
        return m / np.linalg.norm(m, axis=-1, keepdims=True)

    m01, m12, m20 = mid(v[:, 0], v[:, 1]), mid(v[:, 1], v[:, 2]), mid(v[:, 2], v[:, 0])
    expected = np.stack(
        [
            np.stack([v[:, 0], m01, m20], 1),
            np.stack([m01, v[:, 1], m12], 1),
            np.stack([m20, m12, v[:, 2]], 1),
            np.stack([m01, m12, m20], 1),
        ],
        1,
    ).reshape(-1, 3, 3)
    np.testing.assert_allclose(child.vertices[child.faces], expected, atol=1e-15, rtol=0)
    # Corner c of the corner-c child is the parent's corner c, by index.
    kids = child.faces.reshape(-1, 4, 3)
    for c in range(3):
        assert np.array_equal(kids[:, c, c], parent.faces[:, c])
    assert np.all(kids[:, 3] >= parent.num_vertices), "the centre child has only midpoints"
    # Midpoints are numbered in order of first appearance, walking faces and their edges
    # (v0 v1), (v1 v2), (v2 v0): m01, m12, m20 of each face in turn.
    walk = np.stack([kids[:, 3, 0], kids[:, 3, 1], kids[:, 3, 2]], 1).reshape(-1)
    _, first = np.unique(walk, return_index=True)
    assert np.array_equal(walk[np.sort(first)], np.arange(parent.num_vertices, child.num_vertices))


def test_icosphere_nested_face_ranges():
    """Faces f * 4**n .. (f+1) * 4**n - 1 of level p+n tile face f of level p."""
    coarse, fine, n = icosphere(1), icosphere(4), 3
    corners = coarse.vertices[coarse.faces]
    owner = np.repeat(np.arange(coarse.num_faces), 4**n)
    inside = np.ones(fine.num_faces, dtype=bool)
    for k in range(3):
        normal = np.cross(corners[owner, k], corners[owner, (k + 1) % 3])
        inside &= np.einsum("fi,fi->f", normal, fine.face_centroids) > 0
    assert inside.all()
    assert np.allclose(
        np.add.reduceat(fine.face_areas, np.arange(0, fine.num_faces, 4**n)),
        coarse.face_areas,
        rtol=1e-12,
        atol=0,
    )


def test_icosphere_cached_and_readonly():
    s = icosphere(2)
    assert icosphere(2) is s
    for arr in (s.vertices, s.faces, s.vertex_areas, s.face_areas, s.face_centroids):
        with pytest.raises(ValueError):
            arr[0] = 0


@pytest.mark.parametrize("level", [-1, 1.5, "2", True])
def test_icosphere_bad_level(level):
    with pytest.raises(ValueError, match="level"):
        icosphere(level)


def test_icosahedral_group():
    G = ICOSAHEDRAL
    assert G.shape == (60, 3, 3)
    np.testing.assert_allclose(G @ G.transpose(0, 2, 1), np.broadcast_to(np.eye(3), G.shape), atol=1e-12, rtol=0)
    np.testing.assert_allclose(np.linalg.det(G), 1.0, atol=1e-12, rtol=0)
    assert len({tuple(np.round(g, 8).ravel()) for g in G}) == 60
    about_z = [g for g in G if np.allclose(g @ [0, 0, 1], [0, 0, 1], atol=1e-12)]
    assert len(about_z) == 5
    angles = sorted(np.mod(np.arctan2(g[1, 0], g[0, 0]), 2 * np.pi) for g in about_z)
    np.testing.assert_allclose(angles, 2 * np.pi * np.arange(5) / 5, atol=1e-12, rtol=0)


@pytest.mark.parametrize("level", LEVELS)
def test_icosphere_closed_under_icosahedral_group(level):
    s = icosphere(level)
    perms = permutations_for(s.vertices, ICOSAHEDRAL)
    assert max(_deviation(s.vertices, g, p) for g, p in zip(ICOSAHEDRAL, perms)) <= 1e-12
    for g in ICOSAHEDRAL[:: 7 if level > 2 else 1]:
        fperm = s.face_permutation(g)
        assert _deviation(s.face_centroids, g, fperm) <= 1e-12
        assert np.array_equal(np.sort(s.vertex_permutation(g)[s.faces], 1), np.sort(s.faces[fperm], 1))


def test_icosphere_rejects_non_symmetries():
    s = icosphere(2)
    with pytest.raises(ValueError, match="max deviation"):
        s.vertex_permutation(_axis_angle([0, 0, 1], 0.1))
    with pytest.raises(ValueError, match="max deviation"):
        s.face_permutation(_axis_angle([1, 2, 3], 1.0))


@pytest.mark.parametrize("level", [0, 2])
def test_icosphere_face_action_convention(level):
    s = icosphere(level)
    shifts_seen = set()
    for g in ICOSAHEDRAL:
        vperm = s.vertex_permutation(g)
        perm, shift = s.face_action(g)
        assert np.array_equal(np.sort(perm), np.arange(s.num_faces))
        for k in range(3):
            assert np.array_equal(s.faces[perm, (k + shift) % 3], vperm[s.faces[:, k]])
        shifts_seen.update(shift.tolist())
    assert shifts_seen == {0, 1, 2}
    # The central inversion is a symmetry of the icosphere but reverses corner order.
    assert _deviation(s.face_centroids, -np.eye(3), s.face_permutation(-np.eye(3))) <= 1e-12
    with pytest.raises(ValueError, match="proper rotation"):
        s.face_action(-np.eye(3))


def test_face_action_shift_of_a_face_rotation():
    """The 3-fold turn about level-0 face 0 (v0 -> v1 -> v2) on its four level-1 children.

    Corner-k child (4k) -> corner-(k+1) child with shift 1 (v0 at corner 0 of child 0 lands on
    v1 at corner 1 of child 1); the centre child (m01, m12, m20) -> itself, shifted by 1.
    """
    corners = icosphere(0).vertices[icosphere(0).faces[0]]
    turn = _axis_angle(corners.sum(0), 2 * np.pi / 3)
    np.testing.assert_allclose(corners @ turn.T, corners[[1, 2, 0]], atol=1e-12, rtol=0)
    perm, shift = icosphere(1).face_action(turn)
    assert perm[:4].tolist() == [1, 2, 0, 3]
    assert shift[:4].tolist() == [1, 1, 1, 1]


# ----------------------------------------------------------------------------- permutation composition


def _geometries():
    grid = HexPatchGrid(3, 4)
    return {
        "icosphere3": (icosphere(3).vertices, ICOSAHEDRAL),
        "hexagon7": (hexagon_points(7), D6),
        "hexgrid": (grid.points, D6),
        "square6": (square_grid(6, 6), D4),
        "square5": (square_grid(5, 5), D4),
    }


@pytest.mark.parametrize("name", ["icosphere3", "hexagon7", "hexgrid", "square6", "square5"])
def test_permutation_composition(name):
    """perm(g1 @ g2) == perm(g1)[perm(g2)]: g1 g2 p_i = g1 p_{perm2[i]} = p_{perm1[perm2[i]]}."""
    points, group = _geometries()[name]
    perms = permutations_for(points, group)
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, len(group), size=(20, 2))
    for a, b in pairs:
        composed = point_permutation(points, group[a] @ group[b])
        assert np.array_equal(composed, perms[a][perms[b]])
    # Every element acts as a permutation; the identity acts trivially.
    assert np.array_equal(np.sort(perms, axis=1), np.broadcast_to(np.arange(len(points)), perms.shape))
    assert np.array_equal(point_permutation(points, np.eye(points.shape[1])), np.arange(len(points)))


# ----------------------------------------------------------------------------- point_permutation


def test_point_permutation_matches_brute_force():
    """A random orbit of I (no lattice structure), shuffled, against a brute-force nearest search."""
    rng = np.random.default_rng(1)
    seeds = rng.normal(size=(4, 3))
    points = (seeds @ ICOSAHEDRAL.transpose(0, 2, 1)).reshape(-1, 3)[rng.permutation(240)]
    for g in ICOSAHEDRAL[[3, 17, 42]]:
        dist = np.linalg.norm((points @ g.T)[:, None] - points[None], axis=-1)
        assert np.array_equal(point_permutation(points, g), dist.argmin(1))


def test_point_permutation_degenerate_projections():
    """All points project to one value on the search direction: every window holds all points."""
    u = PointIndex(np.zeros((1, 2))).direction
    perp = np.array([-u[1], u[0]])
    points = np.arange(-10, 11)[:, None] * perp
    perm = point_permutation(points, -np.eye(2))
    assert np.array_equal(perm, np.arange(21)[::-1])


def test_point_permutation_reports_max_deviation():
    points = np.array([[0.0, 0.0], [1.0, 0.0]])
    # R(90) sends (1, 0) to (0, 1), whose nearest point is 1 away.
    with pytest.raises(ValueError, match=r"max deviation 1\.000e\+00"):
        point_permutation(points, _rotation_2d(np.pi / 2))
    with pytest.raises(ValueError, match="max deviation"):
        point_permutation(square_grid(3, 4), _rotation_2d(np.pi / 2))
    with pytest.raises(ValueError, match="max deviation"):
        point_permutation(hexagon_points(5), _rotation_2d(np.pi / 2))
    # A deviation of 2e-9 is rejected with atol = 1e-9, and 0.5e-9 accepted.
    pts = np.array([[1.0, 0.0], [-1.0, 0.0]])
    with pytest.raises(ValueError, match=r"max deviation 2\.0"):
        point_permutation(pts, (1 + 2e-9) * np.eye(2), atol=1e-9)
    assert np.array_equal(point_permutation(pts, (1 + 0.5e-9) * np.eye(2), atol=1e-9), [0, 1])
    assert np.array_equal(point_permutation(hexagon_points(3), _rotation_2d(1e-8), atol=1e-6), np.arange(19))
    # The same across the search direction, where only the distance test can reject.
    u = PointIndex(pts).direction
    shear = np.eye(2) + 2e-9 * np.outer([-u[1], u[0]], [1.0, 0.0])
    with pytest.raises(ValueError, match=r"max deviation 2\.0"):
        point_permutation(pts, shear, atol=1e-9)


@pytest.mark.parametrize(
    "points, matrix, message",
    [
        (np.array([[0.0, 0.0], [0.0, 0.0]]), np.eye(2), "duplicate"),
        (np.eye(2), np.eye(3), r"\[2, 2\] matrix"),
        (np.zeros(3), np.eye(3), r"\[P, d\]"),
        (np.array([[1.0, 0.0], [-1.0, 0.0]]), np.zeros((2, 2)), "max deviation"),
        (np.array([[np.nan, 0.0]]), np.eye(2), "NaN"),
        (np.array([[0.0, 0.0], [1.0, 0.0]]), np.zeros((2, 2)), "several points onto one"),
    ],
)
def test_point_permutation_bad_input(points, matrix, message):
    with pytest.raises(ValueError, match=message):
        point_permutation(points, matrix)


def test_permutations_for_shapes():
    pts = hexagon_points(3)
    perms = permutations_for(pts, D6)
    assert perms.shape == (12, 19) and perms.dtype == np.int64
    assert all(np.array_equal(perms[g], point_permutation(pts, D6[g])) for g in range(12))
    with pytest.raises(ValueError, match=r"\[G, 2, 2\]"):
        permutations_for(pts, np.eye(2))


# ----------------------------------------------------------------------------- hexagonal


@pytest.mark.parametrize("n, count", [(1, 1), (2, 7), (3, 19), (4, 37), (5, 61), (9, 217), (12, 397)])
def test_hexagon_point_counts(n, count):
    pts = hexagon_points(n)
    assert pts.shape == (count, 2) == (3 * n * (n - 1) + 1, 2)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_hexagon_points_geometry(n):
    pts = hexagon_points(n)
    coords = hexagon_lattice_coords(n)
    np.testing.assert_allclose(pts, coords[:, :1] * [1, 0] + coords[:, 1:] * [0.5, np.sqrt(3) / 2], atol=1e-15, rtol=0)
    assert len(np.unique(coords, axis=0)) == len(coords)
    # Inside the regular hexagon with corners (n - 1) R(k pi / 3) (1, 0): the inradius is
    # (n - 1) sqrt3 / 2 along the six edge normals at 30 + 60 k degrees.
    normals = np.stack([np.cos(np.pi / 6 + np.pi / 3 * np.arange(6)), np.sin(np.pi / 6 + np.pi / 3 * np.arange(6))], 1)
    assert (pts @ normals.T).max() <= (n - 1) * np.sqrt(3) / 2 + 1e-12
    corners = (n - 1) * np.stack([np.cos(np.pi / 3 * np.arange(6)), np.sin(np.pi / 3 * np.arange(6))], 1)
    assert all(np.abs(pts - c).sum(1).min() < 1e-12 for c in corners)
    # Raster order: rows top to bottom, left to right.
    y, x = pts[:, 1], pts[:, 0]
    assert np.all(np.diff(y) <= 1e-12)
    same_row = np.abs(np.diff(y)) < 1e-12
    assert np.all(np.diff(x)[same_row] > 0)


@pytest.mark.parametrize("n", [2, 5, 9])
def test_hexagon_points_closed_under_d6(n):
    pts = hexagon_points(n)
    perms = permutations_for(pts, D6)
    assert max(_deviation(pts, g, p) for g, p in zip(D6, perms)) <= 1e-12
    # Only the centre is fixed by the rotation r.
    assert np.count_nonzero(perms[1] == np.arange(len(pts))) == 1


def test_hex_patch_grid_seed_numbers():
    """Appendix F: N1 = N2 = 9 gives 217 patches of 217 pixels and 42,073 pixels in all."""
    grid = HexPatchGrid(9, 9)
    assert grid.patch_centers.shape == (217, 2)
    assert grid.pixel_offsets.shape == (217, 2)
    assert grid.patch_index.shape == (217, 217) and grid.patch_index.dtype == np.int64
    assert grid.points.shape == (42073, 2)
    assert (grid.num_patches, grid.patch_size, grid.num_points) == (217, 217, 42073)


@pytest.mark.parametrize("n1, n2", [(2, 3), (5, 9), (9, 9), (4, 6)])
def test_hex_patch_grid_structure(n1, n2):
    grid = HexPatchGrid(n1, n2)
    np.testing.assert_allclose(grid.pixel_offsets, hexagon_points(n2), atol=0, rtol=0)
    np.testing.assert_allclose(
        grid.points[grid.patch_index],
        grid.patch_centers[:, None] + grid.pixel_offsets[None],
        atol=1e-12,
        rtol=0,
    )
    assert np.array_equal(np.unique(grid.patch_index), np.arange(grid.num_points))
    assert len(np.unique(grid.lattice_coords, axis=0)) == grid.num_points
    # Centres: the patch hexagon scaled by (n2 - 1) sqrt3 and rotated by 30 degrees.
    rot30 = _rotation_2d(np.pi / 6)
    np.testing.assert_allclose(
        grid.patch_centers, (n2 - 1) * np.sqrt(3) * hexagon_points(n1) @ rot30.T, atol=1e-12, rtol=0
    )
    # Neighbouring patches share an edge: n2 pixels for E adjacent pairs, one pixel per triple
    # corner (T of them): |H0| = M K - E n2 + T with E = 3 (n1 - 1)(3 n1 - 2), T = 6 (n1 - 1)^2.
    M, K = 3 * n1 * (n1 - 1) + 1, 3 * n2 * (n2 - 1) + 1
    E, T = 3 * (n1 - 1) * (3 * n1 - 2), 6 * (n1 - 1) ** 2
    assert grid.num_points == M * K - E * n2 + T


@pytest.mark.parametrize("n1, n2, spacing", [(9, 9, None), (5, 9, None), (3, 4, 5), (3, 5, 2), (4, 1, None)])
def test_hex_patch_grid_d6_closure_and_consistency(n1, n2, spacing):
    grid = HexPatchGrid(n1, n2, spacing)
    for g in D6:
        pperm = grid.point_permutation(g)
        mperm = grid.patch_permutation(g)
        kperm = grid.offset_permutation(g)
        assert _deviation(grid.points, g, pperm) <= 1e-12
        assert _deviation(grid.patch_centers, g, mperm) <= 1e-12
        assert _deviation(grid.pixel_offsets, g, kperm) <= 1e-12
        # Pixel k of patch m lands on pixel kperm[k] of patch mperm[m].
        expected = np.empty_like(grid.patch_index)
        expected[mperm[:, None], kperm[None, :]] = pperm[grid.patch_index]
        assert np.array_equal(expected, grid.patch_index)


def test_hex_patch_grid_not_square_symmetric():
    grid = HexPatchGrid(3, 3)
    with pytest.raises(ValueError, match="max deviation"):
        grid.point_permutation(_rotation_2d(np.pi / 2))


@pytest.mark.parametrize(
    "kwargs", [{"n_patch_side": 0, "n_pixel_side": 3}, {"n_patch_side": 2, "n_pixel_side": 3, "spacing": 1.5}]
)
def test_hex_patch_grid_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="positive integer"):
        HexPatchGrid(**kwargs)


# ----------------------------------------------------------------------------- square


@pytest.mark.parametrize("height, width", [(1, 1), (3, 4), (4, 4), (5, 5), (16, 16), (2, 7)])
def test_square_grid_layout(height, width):
    pts = square_grid(height, width)
    assert pts.shape == (height * width, 2) and pts.dtype == np.float64
    np.testing.assert_allclose(pts.mean(0), 0.0, atol=1e-12, rtol=0)
    row, col = np.divmod(np.arange(height * width), width)
    np.testing.assert_array_equal(pts[:, 0], col - (width - 1) / 2)
    np.testing.assert_array_equal(pts[:, 1], (height - 1) / 2 - row)
    # Closed under D2 = {1, r^2, t, r^2 t} always.
    for g in D4[[0, 2, 4, 6]]:
        assert _deviation(pts, g, point_permutation(pts, g)) <= 1e-12


@pytest.mark.parametrize("size", [1, 2, 5, 16])
def test_square_grid_closed_under_d4(size):
    pts = square_grid(size, size)
    perms = permutations_for(pts, D4)
    assert max(_deviation(pts, g, p) for g, p in zip(D4, perms)) <= 1e-12
    # Rotating an image by 90 degrees counter-clockwise: numpy's rot90 on the [H, W] layout.
    image = np.arange(size * size).reshape(size, size)
    rotated = np.empty(size * size, dtype=image.dtype)
    rotated[perms[1]] = image.ravel()
    assert np.array_equal(rotated.reshape(size, size), np.rot90(image))


def test_square_grid_non_square_rejects_quarter_turn():
    with pytest.raises(ValueError, match="max deviation"):
        point_permutation(square_grid(3, 4), D4[1])


def test_maps_onto_itself_agrees_with_permutation():
    """The cheap predicate (no error message to build) says yes exactly where ``permutation`` succeeds: D6
    on a square pixel grid keeps the half turn and the two axis reflections, and loses the rest."""
    from eqvit.groups import get_group

    side = np.arange(6) - 2.5
    grid = np.stack(np.meshgrid(side, side, indexing="ij"), -1).reshape(-1, 2)
    index = PointIndex(grid)
    group = get_group("D6")
    kept = []
    for matrix in group.elements:
        try:
            index.permutation(matrix)
            succeeded = True
        except ValueError:
            succeeded = False
        assert index.maps_onto_itself(matrix) is succeeded
        kept.append(succeeded)
    assert sum(kept) == 4
