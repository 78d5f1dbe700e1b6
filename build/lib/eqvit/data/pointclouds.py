"""Synthetic 3-D point-cloud classification, generated in code, for the Platonic Transformers.

Ten shape classes that differ only in geometry (every sample is centred and scaled to unit RMS
radius, so neither position nor size tells the class):

=================  ==========================================================================
``tetrahedron``    surface of a regular tetrahedron
``cube``           surface of a cube
``octahedron``     surface of a regular octahedron
``icosahedron``    surface of a regular icosahedron
``torus``          ring torus, tube / ring radius ratio in [0.3, 0.5]
``helix``          tube around a right-handed helix, 2.25-2.75 turns, open ends
``ellipsoid``      ellipsoid with three distinct semi-axes (about 1 : 0.7 : 0.45)
``cylinder``       closed cylinder (lateral surface and both caps), height / radius about 2.5
``cone``           closed right circular cone (lateral surface and base), height / radius about 1.5
``linked_rings``   two thin interlocked tori (a Hopf link) in perpendicular planes
=================  ==========================================================================

(The dodecahedron is left out on purpose: at unit RMS radius it differs from the icosahedron by
less than the jitter below, so it would cap the attainable accuracy rather than test symmetry.)

Points are sampled exactly uniformly on each surface: area-weighted triangles for the polyhedra
(fan-triangulated faces), the ``1 - kappa * rho * cos(phi)`` area element for tubes around curves
(Kepler's equation, solved by Newton), area-weighted parts for the closed cylinder and cone, and
rejection for the ellipsoid. Each sample gets its own shape jitter (the polyhedra: anisotropic
scaling of the vertices by a factor in [0.9, 1.1] per axis, before the area weights are computed;
the smooth shapes: their radii, ratios, turns and offsets), then i.i.d. Gaussian noise of standard
deviation ``noise`` (in units of the RMS radius) per coordinate, then exact normalisation: centroid
at the origin, RMS distance to it 1. Only then is the sample rotated (``rotate``):

* ``"none"``: the canonical orientation (symmetry axes along the coordinate axes; torus, helix,
  cylinder and cone about z),
* ``"z"``: a uniform random rotation about the z axis,
* ``"so3"``: a Haar-uniform random rotation (:func:`eqvit.groups.so3.random_rotations`).

Shapes, labels and rotations come from independent seeded streams, so for one ``seed`` the samples
under ``"none"`` and ``"so3"`` are the same point sets, only rotated. Features are all ones
(``[S, N, 1]``): the geometry must come from the positions. 5,000 samples of 256 points take well
under a second on one CPU core.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from eqvit.utils import unknown_name_error

ROTATE_MODES = ("so3", "none", "z")

_PHI = (1 + math.sqrt(5)) / 2


class PointCloudSet(NamedTuple):
    """One labelled set: ``pos [S, N, 3]`` float32, ``feat [S, N, 1]`` float32 ones, ``labels [S]`` int64."""

    pos: torch.Tensor
    feat: torch.Tensor
    labels: torch.Tensor


class PointCloudSplits(NamedTuple):
    """Fixed seeded train / validation / test sets (each a :class:`PointCloudSet`)."""

    train: PointCloudSet
    val: PointCloudSet
    test: PointCloudSet
    classes: tuple[str, ...]


# ----------------------------------------------------------------------------------------------
# polyhedra
# ----------------------------------------------------------------------------------------------

_POLYHEDRON_VERTICES: dict[str, list[tuple[float, float, float]]] = {
    "tetrahedron": [(1, 1, 1), (1, -1, -1), (-1, 1, -1), (-1, -1, 1)],
    "cube": [(x, y, z) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)],
    "octahedron": [(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)],
    "icosahedron": [
        p
        for a in (-1, 1)
        for b in (-_PHI, _PHI)
        for p in ((0, a, b), (a, b, 0), (b, 0, a))  # cyclic permutations of (0, +-1, +-phi)
    ],
}


@functools.cache
def _polyhedron_triangles(name: str) -> np.ndarray:
    """``[T, 3]`` vertex indices: each face of the convex hull, fan-triangulated (no overlaps)."""
    v = np.asarray(_POLYHEDRON_VERTICES[name], dtype=np.float64)
    n = len(v)
    faces: dict[tuple, list[int]] = {}
    for i in range(n):
        for j in range(i + 1, n):
            for k in range(j + 1, n):
                normal = np.cross(v[j] - v[i], v[k] - v[i])
                if np.linalg.norm(normal) < 1e-9:
                    continue
                normal /= np.linalg.norm(normal)
                side = (v - v[i]) @ normal
                if side.max() > 1e-9:
                    if side.min() < -1e-9:
                        continue  # not a supporting plane
                    normal, side = -normal, -side
                on_face = tuple(np.flatnonzero(np.abs(side) < 1e-9))
                faces.setdefault(on_face, list(on_face))
    triangles = []
    for idx in faces.values():
        pts = v[idx]
        centre = pts.mean(0)
        normal = np.cross(pts[1] - pts[0], pts[2] - pts[0])
        u = pts[0] - centre
        w = np.cross(normal, u)
        order = np.argsort(np.arctan2((pts - centre) @ w, (pts - centre) @ u))
        ring = [idx[o] for o in order]
        triangles += [(ring[0], ring[m], ring[m + 1]) for m in range(1, len(ring) - 1)]
    return np.asarray(triangles, dtype=np.int64)


def _sample_triangles(rng: np.random.Generator, tri: np.ndarray, num_points: int) -> np.ndarray:
    """Uniform points on triangle meshes ``tri [n, T, 3 corners, 3]`` (one mesh per sample) -> ``[n, N, 3]``."""
    a, b, c = tri[:, :, 0], tri[:, :, 1], tri[:, :, 2]
    area = np.linalg.norm(np.cross(b - a, c - a), axis=-1)  # [n, T], twice the area
    cdf = np.cumsum(area, axis=1)
    cdf /= cdf[:, -1:]
    u = rng.random((len(tri), num_points))
    face = np.minimum((u[:, :, None] > cdf[:, None, :]).sum(-1), tri.shape[1] - 1)  # [n, N]
    r1, r2 = rng.random((2, len(tri), num_points, 1))
    flip = (r1 + r2) > 1  # reflect into the lower triangle: uniform barycentric coordinates
    r1, r2 = np.where(flip, 1 - r1, r1), np.where(flip, 1 - r2, r2)
    take = lambda corner: np.take_along_axis(corner, face[:, :, None], axis=1)  # noqa: E731
    A, B, C = take(a), take(b), take(c)
    return A + r1 * (B - A) + r2 * (C - A)


def _polyhedron(name: str) -> Callable[[np.random.Generator, int, int], np.ndarray]:
    def sample(rng: np.random.Generator, n: int, num_points: int) -> np.ndarray:
        v = np.asarray(_POLYHEDRON_VERTICES[name], dtype=np.float64)
        scale = rng.uniform(0.9, 1.1, size=(n, 1, 3))  # anisotropic jitter, per sample
        tri = (v[None] * scale)[:, _polyhedron_triangles(name)]  # [n, T, 3, 3]
        return _sample_triangles(rng, tri, num_points)

    return sample


# ----------------------------------------------------------------------------------------------
# tubes around curves (torus, helix, linked rings)
# ----------------------------------------------------------------------------------------------


def _kepler(rng: np.random.Generator, e: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Angles ``phi`` in [0, 2 pi) with density proportional to ``1 - e cos(phi)`` (``0 <= e < 1``)."""
    m = 2 * math.pi * rng.random(shape)  # phi - e sin(phi) = m: Kepler's equation, monotonic in phi
    phi = m + e * np.sin(m)
    for _ in range(30):
        step = (phi - e * np.sin(phi) - m) / (1 - e * np.cos(phi))
        phi -= step
        if np.abs(step).max() < 1e-13:
            break
    return phi


def _helix_tube(
    rng: np.random.Generator, num_points: int, A: np.ndarray, B: np.ndarray, turns: np.ndarray, rho: np.ndarray
) -> np.ndarray:
    """Uniform points on the tube of radius ``rho`` around ``(A cos t, A sin t, B t)``, ``t in [0, 2 pi turns)``.

    All arguments ``[n]``; ``B = 0, turns = 1`` is the torus with ring radius ``A``. The curve has
    constant speed ``s = sqrt(A^2 + B^2)`` (so uniform ``t`` is uniform arc length) and curvature
    ``kappa = A / s^2``; with ``phi`` measured from the principal normal (towards the axis) the
    tube's area element is proportional to ``1 - kappa * rho * cos(phi)``.
    """
    A, B, turns, rho = (np.asarray(x, dtype=np.float64)[:, None] for x in (A, B, turns, rho))
    n = A.shape[0]
    t = 2 * math.pi * turns * rng.random((n, num_points))
    s = np.sqrt(A**2 + B**2)
    phi = _kepler(rng, np.broadcast_to(A / s**2 * rho, (n, num_points)), (n, num_points))
    cos_t, sin_t = np.cos(t), np.sin(t)
    centre = np.stack([A * cos_t, A * sin_t, B * t], -1)
    normal = np.stack([-cos_t, -sin_t, np.zeros_like(t)], -1)
    binormal = np.stack([B * sin_t, -B * cos_t, np.broadcast_to(A, t.shape)], -1) / s[..., None]
    return centre + rho[..., None] * (np.cos(phi)[..., None] * normal + np.sin(phi)[..., None] * binormal)


def _torus(rng: np.random.Generator, n: int, num_points: int) -> np.ndarray:
    ratio = rng.uniform(0.3, 0.5, n)
    return _helix_tube(rng, num_points, np.ones(n), np.zeros(n), np.ones(n), ratio)


def _helix(rng: np.random.Generator, n: int, num_points: int) -> np.ndarray:
    turns = rng.uniform(2.25, 2.75, n)
    pitch = rng.uniform(0.3, 0.4, n)  # rise per radian; 2 pi * pitch > 2 * rho keeps turns apart
    rho = rng.uniform(0.2, 0.3, n)
    return _helix_tube(rng, num_points, np.ones(n), pitch, turns, rho)


def _linked_rings(rng: np.random.Generator, n: int, num_points: int) -> np.ndarray:
    rho = rng.uniform(0.1, 0.2, n)
    offset = rng.uniform(0.9, 1.1, n)  # centre of the second ring, on the x axis
    first = num_points // 2  # equal tube areas: half the points on each ring
    ring1 = _helix_tube(rng, first, np.ones(n), np.zeros(n), np.ones(n), rho)
    ring2 = _helix_tube(rng, num_points - first, np.ones(n), np.zeros(n), np.ones(n), rho)
    ring2 = ring2[..., [0, 2, 1]]  # into the xz plane
    ring2[..., 0] += offset[:, None]
    return np.concatenate([ring1, ring2], axis=1)


# ----------------------------------------------------------------------------------------------
# ellipsoid, cylinder, cone
# ----------------------------------------------------------------------------------------------


def _unit_sphere(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape + (3,))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _ellipsoid(rng: np.random.Generator, n: int, num_points: int) -> np.ndarray:
    """Rejection from the sphere: ``diag(a) x`` with ``x`` uniform on S^2 is accepted with
    probability proportional to the area stretch ``|diag(bc, ac, ab) x|``."""
    axes = np.array([1.0, 0.7, 0.45]) * rng.uniform(0.9, 1.1, (n, 3))  # stays 3 distinct axes
    a, b, c = axes.T
    stretch = np.stack([b * c, a * c, a * b], -1)[:, None]  # [n, 1, 3]
    out = np.empty((n, num_points, 3))
    todo = np.arange(n)
    while len(todo):
        m = 4 * num_points
        x = _unit_sphere(rng, (len(todo), m))
        w = np.linalg.norm(x * stretch[todo], axis=-1)
        accept = rng.random(w.shape) * stretch[todo, 0].max(-1, keepdims=True) < w  # w <= max stretch
        order = np.argsort(~accept, axis=1, kind="stable")[:, :num_points]  # accepted first
        done = accept.sum(1) >= num_points
        out[todo[done]] = np.take_along_axis(x, order[:, :, None], axis=1)[done] * axes[todo[done], None]
        todo = todo[~done]
    return out


def _disk(rng: np.random.Generator, r: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    rad, ang = r[:, None] * np.sqrt(rng.random(shape)), 2 * math.pi * rng.random(shape)
    return rad * np.cos(ang), rad * np.sin(ang)


def _cylinder(rng: np.random.Generator, n: int, num_points: int) -> np.ndarray:
    r = np.ones(n)
    h = rng.uniform(2.1, 2.9, n)
    shape = (n, num_points)
    part = rng.random(shape) * (h * r + r * r)[:, None]  # lateral 2 pi r h : caps 2 pi r^2
    lateral = part < (h * r)[:, None]
    ang = 2 * math.pi * rng.random(shape)
    z_lat = (rng.random(shape) - 0.5) * h[:, None]
    dx, dy = _disk(rng, r, shape)
    top = rng.random(shape) < 0.5
    z_cap = np.where(top, 0.5, -0.5) * h[:, None]
    x = np.where(lateral, r[:, None] * np.cos(ang), dx)
    y = np.where(lateral, r[:, None] * np.sin(ang), dy)
    return np.stack([x, y, np.where(lateral, z_lat, z_cap)], -1)


def _cone(rng: np.random.Generator, n: int, num_points: int) -> np.ndarray:
    r = np.ones(n)
    h = rng.uniform(1.3, 1.7, n)
    slant = np.sqrt(r**2 + h**2)
    shape = (n, num_points)
    part = rng.random(shape) * (r * slant + r * r)[:, None]  # lateral pi r l : base pi r^2
    lateral = part < (r * slant)[:, None]
    frac = np.sqrt(rng.random(shape))  # distance from the apex / slant: density proportional to it
    ang = 2 * math.pi * rng.random(shape)
    dx, dy = _disk(rng, r, shape)
    x = np.where(lateral, frac * r[:, None] * np.cos(ang), dx)
    y = np.where(lateral, frac * r[:, None] * np.sin(ang), dy)
    z = np.where(lateral, h[:, None] * (1 - frac), 0.0)  # apex at z = h, base at z = 0
    return np.stack([x, y, z], -1)


_SAMPLERS: dict[str, Callable[[np.random.Generator, int, int], np.ndarray]] = {
    "tetrahedron": _polyhedron("tetrahedron"),
    "cube": _polyhedron("cube"),
    "octahedron": _polyhedron("octahedron"),
    "icosahedron": _polyhedron("icosahedron"),
    "torus": _torus,
    "helix": _helix,
    "ellipsoid": _ellipsoid,
    "cylinder": _cylinder,
    "cone": _cone,
    "linked_rings": _linked_rings,
}

POINTCLOUD_CLASSES: tuple[str, ...] = tuple(_SAMPLERS)


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------


def _normalise(x: np.ndarray) -> np.ndarray:
    """Centroid at the origin and unit RMS radius, per sample (``[n, N, 3]``)."""
    x = x - x.mean(axis=1, keepdims=True)
    x *= np.sqrt(x.shape[1] / np.einsum("snd,snd->s", x, x))[:, None, None]
    return x


def _check_classes(classes: Sequence[str] | None) -> tuple[str, ...]:
    if classes is None:
        return POINTCLOUD_CLASSES
    if isinstance(classes, str):
        raise ValueError(f"expected classes to be a sequence of class names or None, got the string {classes!r}")
    classes = tuple(classes)
    if not classes:
        raise ValueError(f"expected at least one class out of {', '.join(POINTCLOUD_CLASSES)}, got none")
    for name in classes:
        if name not in _SAMPLERS:
            raise unknown_name_error("point-cloud class", name, POINTCLOUD_CLASSES)
    if len(set(classes)) != len(classes):
        raise ValueError(f"expected distinct class names, got {list(classes)}")
    return classes


def _check_rotate(rotate: str, what: str = "rotate") -> str:
    if rotate not in ROTATE_MODES:
        close = difflib.get_close_matches(str(rotate).lower(), ROTATE_MODES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"expected {what} to be one of {', '.join(map(repr, ROTATE_MODES))}, got {rotate!r}.{hint}")
    return rotate


def _check_int(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"expected {name} to be an int >= {minimum}, got {value!r}")
    return int(value)


def _rotations(mode: str, n: int, seed: np.random.SeedSequence) -> np.ndarray | None:
    if mode == "none":
        return None
    gen = torch.Generator().manual_seed(int(seed.generate_state(1, dtype=np.uint64)[0]) >> 1)
    if mode == "so3":
        from eqvit.groups.so3 import random_rotations

        return random_rotations(n, generator=gen, dtype=torch.float64).numpy()
    angle = (2 * math.pi * torch.rand(n, generator=gen, dtype=torch.float64)).numpy()
    c, s = np.cos(angle), np.sin(angle)
    R = np.zeros((n, 3, 3))
    R[:, 0, 0], R[:, 0, 1], R[:, 1, 0], R[:, 1, 1], R[:, 2, 2] = c, -s, s, c, 1.0
    return R


def _generate(
    num_samples: int,
    num_points: int,
    classes: tuple[str, ...],
    rotate: str,
    noise: float,
    seed: np.random.SeedSequence,
) -> PointCloudSet:
    label_seed, shape_seed, noise_seed, rotation_seed = seed.spawn(4)
    k = len(classes)
    labels = np.random.default_rng(label_seed).permutation(np.arange(num_samples) % k)  # balanced
    pos = np.empty((num_samples, num_points, 3))
    shape_rng = np.random.default_rng(shape_seed)
    for c, name in enumerate(classes):
        idx = np.flatnonzero(labels == c)
        if len(idx):
            pos[idx] = _normalise(_SAMPLERS[name](shape_rng, len(idx), num_points))
    if noise > 0:
        pos += noise * np.random.default_rng(noise_seed).standard_normal(pos.shape)
    pos = _normalise(pos)
    R = _rotations(rotate, num_samples, rotation_seed)
    if R is not None:
        pos = pos @ R.transpose(0, 2, 1)  # x -> R x for every point
    return PointCloudSet(
        pos=torch.from_numpy(pos.astype(np.float32)),
        feat=torch.ones(num_samples, num_points, 1),
        labels=torch.from_numpy(labels.astype(np.int64)),
    )


def synthetic_pointclouds(
    num_samples: int,
    num_points: int = 256,
    classes: Sequence[str] | None = None,
    rotate: str = "so3",
    noise: float = 0.01,
    seed: int = 0,
) -> PointCloudSet:
    """Labelled synthetic point clouds: ``(pos [S, N, 3], feat [S, N, 1], labels [S])``.

    Args:
        num_samples: ``S``, the number of clouds; the classes are balanced (counts differ by at
            most one) and shuffled.
        num_points: ``N`` points per cloud (at least 4).
        classes: class names out of :data:`POINTCLOUD_CLASSES` (default: all ten, in that order);
            ``labels`` index into this sequence.
        rotate: ``"so3"`` (Haar-uniform random rotation per sample), ``"z"`` (uniform about z) or
            ``"none"`` (canonical orientation).
        noise: standard deviation of the per-coordinate Gaussian noise, relative to the unit RMS
            radius (applied before the final normalisation).
        seed: seeds everything; the same seed gives the same clouds, and the same point sets
            (up to each sample's rotation) under every ``rotate`` mode.

    Returns:
        A :class:`PointCloudSet` (a named tuple): ``pos`` float32 ``[S, N, 3]``, centroid 0 and RMS
        radius 1 per cloud; ``feat`` float32 ``[S, N, 1]`` all ones; ``labels`` int64 ``[S]``.
    """
    num_samples = _check_int(num_samples, "num_samples", 0)
    num_points = _check_int(num_points, "num_points", 4)
    classes = _check_classes(classes)
    rotate = _check_rotate(rotate)
    if not isinstance(noise, (int, float)) or isinstance(noise, bool) or not 0 <= noise < 1:
        raise ValueError(f"expected noise to be a float in [0, 1), got {noise!r}")
    seed = _check_int(seed, "seed", 0)
    return _generate(num_samples, num_points, classes, rotate, float(noise), np.random.SeedSequence(seed))


def pointcloud_splits(
    num_train: int,
    num_test: int,
    num_val: int = 0,
    *,
    num_points: int = 256,
    classes: Sequence[str] | None = None,
    train_rotate: str = "none",
    test_rotate: str = "so3",
    val_rotate: str | None = None,
    noise: float = 0.01,
    seed: int = 0,
) -> PointCloudSplits:
    """Fixed seeded train / validation / test sets of :func:`synthetic_pointclouds`.

    Each split has its own stream derived from ``seed``, so a split does not change with the
    other splits' sizes or rotation modes: the test set for ``train_rotate="none"`` and for
    ``train_rotate="so3"`` is the same tensor, which keeps model comparisons fair.

    Args:
        num_train, num_test, num_val: split sizes ``S`` (``num_val = 0`` gives an empty val set).
        num_points, classes, noise: as in :func:`synthetic_pointclouds`.
        train_rotate, test_rotate: ``"so3" | "none" | "z"`` for the training and the test set (the
            benchmark trains with ``"none"`` or ``"so3"`` and tests with ``"so3"``).
        val_rotate: the validation set's mode; ``None`` follows ``train_rotate`` (model selection
            must not see the test distribution).
        seed: seeds all three splits.

    Returns:
        :class:`PointCloudSplits` ``(train, val, test, classes)``; each split is a
        :class:`PointCloudSet` ``(pos [S, N, 3], feat [S, N, 1], labels [S])``.
    """
    sizes = [
        _check_int(v, name, 0) for v, name in ((num_train, "num_train"), (num_val, "num_val"), (num_test, "num_test"))
    ]
    num_points = _check_int(num_points, "num_points", 4)
    classes = _check_classes(classes)
    modes = [
        _check_rotate(train_rotate, "train_rotate"),
        _check_rotate(train_rotate if val_rotate is None else val_rotate, "val_rotate"),
        _check_rotate(test_rotate, "test_rotate"),
    ]
    if not isinstance(noise, (int, float)) or isinstance(noise, bool) or not 0 <= noise < 1:
        raise ValueError(f"expected noise to be a float in [0, 1), got {noise!r}")
    seed = _check_int(seed, "seed", 0)
    sets = [
        _generate(size, num_points, classes, mode, float(noise), np.random.SeedSequence([seed, split]))
        for split, (size, mode) in enumerate(zip(sizes, modes), start=1)
    ]
    return PointCloudSplits(*sets, classes=classes)


def plot_pointclouds(path: str, num_points: int = 512, seed: int = 0, rotate: str = "none") -> None:
    """Write a PNG with one 3-D scatter per class (for the README)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(POINTCLOUD_CLASSES)
    data = _generate(k, num_points, POINTCLOUD_CLASSES, _check_rotate(rotate), 0.01, np.random.SeedSequence(seed))
    cols = 5
    fig = plt.figure(figsize=(3 * cols, 3 * math.ceil(k / cols)))
    for c, name in enumerate(POINTCLOUD_CLASSES):
        p = data.pos[int((data.labels == c).nonzero()[0])].numpy()
        ax = fig.add_subplot(math.ceil(k / cols), cols, c + 1, projection="3d")
        ax.scatter(p[:, 0], p[:, 1], p[:, 2], s=3, c=p[:, 2], cmap="viridis")
        ax.set_title(name)
        ax.set_box_aspect((1, 1, 1))
        lim = np.abs(p).max()
        ax.set(xlim=(-lim, lim), ylim=(-lim, lim), zlim=(-lim, lim), xticks=[], yticks=[], zticks=[])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
