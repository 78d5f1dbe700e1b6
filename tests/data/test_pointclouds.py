"""Synthetic 3-D point-cloud classification (eqvit.data.pointclouds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import eqvit.data
from eqvit.data.pointclouds import (
    _POLYHEDRON_VERTICES,
    _SAMPLERS,
    POINTCLOUD_CLASSES,
    _kepler,
    _polyhedron_triangles,
    pointcloud_splits,
    synthetic_pointclouds,
)


def test_shapes_dtypes_and_exports():
    pos, feat, labels = synthetic_pointclouds(23, num_points=64, seed=1)
    assert pos.shape == (23, 64, 3) and pos.dtype == torch.float32
    assert feat.shape == (23, 64, 1) and feat.dtype == torch.float32 and bool((feat == 1).all())
    assert labels.shape == (23,) and labels.dtype == torch.int64
    assert len(POINTCLOUD_CLASSES) >= 8 and len(set(POINTCLOUD_CLASSES)) == len(POINTCLOUD_CLASSES)
    assert eqvit.data.synthetic_pointclouds is synthetic_pointclouds
    assert eqvit.data.POINTCLOUD_CLASSES == POINTCLOUD_CLASSES
    assert synthetic_pointclouds(0, num_points=8).pos.shape == (0, 8, 3)


def test_deterministic_per_seed():
    a = synthetic_pointclouds(30, num_points=32, seed=3)
    b = synthetic_pointclouds(30, num_points=32, seed=3)
    c = synthetic_pointclouds(30, num_points=32, seed=4)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a.pos, c.pos)


@pytest.mark.parametrize("rotate", ["none", "z", "so3"])
def test_centred_unit_rms_radius(rotate):
    pos = synthetic_pointclouds(40, num_points=100, rotate=rotate, seed=0).pos.double()
    torch.testing.assert_close(pos.mean(1), torch.zeros(40, 3, dtype=torch.float64), atol=1e-6, rtol=0)
    rms = pos.pow(2).sum(-1).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones(40, dtype=torch.float64), atol=1e-6, rtol=0)


def test_rotation_modes_only_rotate_the_same_point_sets():
    """For one seed, "so3" and "z" are "none" with one rotation per sample: equal distance matrices,
    a proper rotation fitting exactly (Kabsch), and z coordinates kept by "z"."""
    kw = dict(num_samples=20, num_points=50, seed=5)
    none, so3, z = (synthetic_pointclouds(rotate=m, **kw) for m in ("none", "so3", "z"))
    assert torch.equal(none.labels, so3.labels) and torch.equal(none.labels, z.labels)
    p, q = none.pos.double(), so3.pos.double()
    torch.testing.assert_close(torch.cdist(q, q), torch.cdist(p, p), atol=1e-5, rtol=0)
    u, _, vh = torch.linalg.svd(q.transpose(1, 2) @ p)  # R = argmin |R p - q| over O(3)
    R = u @ vh
    assert torch.allclose(torch.linalg.det(R), torch.ones(20, dtype=torch.float64), atol=1e-6)  # proper
    torch.testing.assert_close(p @ R.transpose(1, 2), q, atol=1e-5, rtol=0)
    assert not torch.allclose(p, q, atol=1e-2)  # it did rotate
    torch.testing.assert_close(z.pos[..., 2], none.pos[..., 2], atol=1e-6, rtol=0)
    torch.testing.assert_close(z.pos.norm(dim=-1), none.pos.norm(dim=-1), atol=1e-5, rtol=0)


def test_so3_rotations_cover_the_sphere():
    """Haar-uniform rotations: the image of a fixed body axis is uniform on S^2 (mean ~ 0)."""
    so3 = synthetic_pointclouds(2000, num_points=8, classes=["cone"], rotate="so3", seed=2).pos.double()
    # the first point's direction (one body point per sample), rotated: mean ~ 0, second moment ~ I/3
    d = so3[:, 0] / so3[:, 0].norm(dim=-1, keepdim=True)
    assert d.mean(0).abs().max() < 0.07
    torch.testing.assert_close(d.T @ d / len(d), torch.eye(3, dtype=torch.float64) / 3, atol=0.04, rtol=0)


def test_classes_balanced_and_subset():
    labels = synthetic_pointclouds(103, num_points=8, seed=0).labels
    counts = torch.bincount(labels, minlength=len(POINTCLOUD_CLASSES))
    assert counts.max() - counts.min() <= 1 and counts.sum() == 103
    sub = synthetic_pointclouds(12, num_points=8, classes=["torus", "cube", "helix"], seed=0)
    assert torch.equal(torch.bincount(sub.labels), torch.tensor([4, 4, 4]))
    assert synthetic_pointclouds(5, num_points=8, classes=["torus"], seed=0).labels.eq(0).all()


def test_polyhedron_triangulation_covers_each_face_once():
    """Total triangle area equals the surface area (fans, no overlaps): cube of side 2 -> 24,
    tetrahedron of edge 2 sqrt 2 -> 8 sqrt 3, octahedron of edge sqrt 2 -> 4 sqrt 3,
    icosahedron of edge 2 -> 20 sqrt 3."""
    expected = {
        "tetrahedron": 8 * math.sqrt(3),
        "cube": 24.0,
        "octahedron": 4 * math.sqrt(3),
        "icosahedron": 20 * math.sqrt(3),
    }
    faces = {"tetrahedron": 4, "cube": 12, "octahedron": 8, "icosahedron": 20}
    for name, area in expected.items():
        v = np.asarray(_POLYHEDRON_VERTICES[name], dtype=np.float64)
        tri = v[_polyhedron_triangles(name)]
        got = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=-1).sum()
        assert len(tri) == faces[name]
        assert got == pytest.approx(area, rel=1e-12), name


def test_polyhedron_points_lie_on_the_surface():
    """Without noise, every cube point has its largest |coordinate| on a (jittered) face plane."""
    x = _SAMPLERS["cube"](np.random.default_rng(0), 50, 200)
    half = np.abs(x).max(1)  # [n, 3]: per-sample half side along each axis (the jitter)
    assert np.all((half > 0.9 - 1e-12) & (half < 1.1 + 1e-12))
    on_face = np.isclose(np.abs(x), half[:, None], atol=1e-12).any(-1)
    assert on_face.all()


def test_tube_area_element():
    """Kepler sampling: density (1 - e cos phi) / 2 pi has E[cos phi] = -e / 2; and the torus
    (ring radius 1, tube r) has a fraction 1/2 + r / pi of its area outside the ring circle."""
    e = np.full((200_000,), 0.4)
    phi = _kepler(np.random.default_rng(0), e, e.shape)
    assert np.cos(phi).mean() == pytest.approx(-0.2, abs=0.005)
    x = _SAMPLERS["torus"](np.random.default_rng(1), 400, 500)
    rho = np.sqrt(x[..., 0] ** 2 + x[..., 1] ** 2)
    tube = np.abs(x[..., 2]).max(1)  # ~ the per-sample tube radius
    assert (rho > 1).mean() == pytest.approx(0.5 + tube.mean() / math.pi, abs=0.01)


def test_separable_by_rotation_invariant_statistics():
    """Learnable: a nearest-centroid classifier on histograms of the radii |x| (invariant), fitted
    on canonical clouds and tested on SO(3)-rotated ones, is far above chance (1 / 10)."""
    splits = pointcloud_splits(600, 400, num_points=128, train_rotate="none", test_rotate="so3", seed=0)

    def hist(pos):
        r = pos.double().norm(dim=-1).numpy()
        return np.stack([np.histogram(a, bins=20, range=(0, 2.5))[0] for a in r]) / r.shape[1]

    k = len(splits.classes)
    ftr, ytr = hist(splits.train.pos), splits.train.labels.numpy()
    fte, yte = hist(splits.test.pos), splits.test.labels.numpy()
    centroids = np.stack([ftr[ytr == c].mean(0) for c in range(k)])
    pred = ((fte[:, None] - centroids[None]) ** 2).sum(-1).argmin(1)
    accuracy = (pred == yte).mean()
    assert accuracy > 0.7, accuracy


def test_splits_are_fixed_and_independent():
    a = pointcloud_splits(20, 10, 6, num_points=16, train_rotate="none", test_rotate="so3", seed=7)
    b = pointcloud_splits(40, 10, 6, num_points=16, train_rotate="so3", test_rotate="so3", seed=7)
    assert a.train.pos.shape == (20, 16, 3) and a.val.pos.shape == (6, 16, 3) and a.test.pos.shape == (10, 16, 3)
    assert a.classes == POINTCLOUD_CLASSES
    for x, y in zip(a.test, b.test):  # the test set ignores the other splits' sizes and modes
        assert torch.equal(x, y)
    # val follows train_rotate by default: the same clouds, rotated in b
    assert torch.equal(a.val.labels, b.val.labels)
    torch.testing.assert_close(torch.cdist(a.val.pos, a.val.pos), torch.cdist(b.val.pos, b.val.pos), atol=1e-5, rtol=0)
    assert not torch.allclose(a.val.pos, b.val.pos, atol=1e-2)
    assert not torch.equal(a.train.pos[:6], a.val.pos)  # splits are different draws
    empty = pointcloud_splits(4, 4, num_points=8)
    assert empty.val.pos.shape == (0, 8, 3)


def test_generation_is_fast():
    import time

    start = time.perf_counter()
    synthetic_pointclouds(1000, num_points=256)
    assert time.perf_counter() - start < 2.0  # 5,000 x 256 takes about 1 s on a busy shared core


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(classes=["cubee"]), r"unknown point-cloud class 'cubee'\. Did you mean 'cube'\?"),
        (dict(classes="cube"), "sequence of class names"),
        (dict(classes=[]), "at least one class"),
        (dict(classes=["cube", "cube"]), "distinct"),
        (dict(num_points=3), r"num_points to be an int >= 4, got 3"),
        (dict(num_points=2.5), r"num_points to be an int >= 4, got 2\.5"),
        (dict(num_samples=-1), "num_samples"),
        (dict(rotate="SO3"), r"rotate to be one of 'so3', 'none', 'z', got 'SO3'\. Did you mean 'so3'\?"),
        (dict(rotate="random"), r"one of 'so3', 'none', 'z', got 'random'"),
        (dict(noise=-0.1), r"noise to be a float in \[0, 1\), got -0\.1"),
        (dict(seed=-1), "seed"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(num_samples=4, num_points=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        synthetic_pointclouds(**args)


def test_bad_split_arguments():
    with pytest.raises(ValueError, match=r"test_rotate to be one of .*got 'o3'"):
        pointcloud_splits(4, 4, test_rotate="o3")
    with pytest.raises(ValueError, match=r"val_rotate"):
        pointcloud_splits(4, 4, val_rotate="x")
    with pytest.raises(ValueError, match=r"num_test"):
        pointcloud_splits(4, -4)
