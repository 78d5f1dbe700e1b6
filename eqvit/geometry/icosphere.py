"""Icospheres: recursively subdivided icosahedra with hierarchical vertex and face order.

Level 0 is the icosahedron in the orientation of ``eqvit.groups.get_group("I")``::

    vertex 0         (0, 0, 1)                                          north pole
    vertex 1 + k     (2/sqrt5 cos(2 pi k / 5),       2/sqrt5 sin(...),  1/sqrt5)   k = 0..4
    vertex 6 + k     (2/sqrt5 cos(2 pi (k + 1/2) / 5), 2/sqrt5 sin(...), -1/sqrt5)  k = 0..4
    vertex 11        (0, 0, -1)                                         south pole

so the rotations about z in the icosahedral group form C5. Its 20 faces come in four blocks of
five, for k = 0..4 and ``k' = (k + 1) % 5``::

    faces 0..4    (0, 1+k, 1+k')          north cap
    faces 5..9    (1+k, 6+k, 1+k')        upper band (pointing down)
    faces 10..14  (6+k, 6+k', 1+k')       lower band (pointing up)
    faces 15..19  (11, 6+k', 6+k)         south cap

All faces (at every level) are outward counter-clockwise: ``det[v0, v1, v2] > 0``.

Subdivision (level l-1 -> l) splits every face (v0, v1, v2) into four with the normalized edge
midpoints ``m01, m12, m20``. Hierarchical order:

- the ``10 * 4**(l-1) + 2`` vertices of level l-1 keep their indices; the midpoints are appended
  in order of first appearance when walking the faces in order and each face's edges in the
  order (v0 v1), (v1 v2), (v2 v0);
- the children of face f are faces ``4f .. 4f+3``::

      4f     (v0,  m01, m20)   corner-0 child
      4f+1   (m01, v1,  m12)   corner-1 child
      4f+2   (m20, m12, v2 )   corner-2 child
      4f+3   (m01, m12, m20)   centre child

  so the faces of level L inside face f of level p are the contiguous range
  ``f * 4**(L-p) .. (f+1) * 4**(L-p) - 1``, and corner c of face f of level p is corner c of
  face ``4**(L-p) * f + c * (4**(L-p) - 1) / 3`` (the corner-c child, repeatedly) of level L.
  The SO(3) tokenizer relies on this order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from eqvit.geometry.points import PointIndex
from eqvit.utils import check_memory

__all__ = ["Icosphere", "icosphere", "spherical_triangle_area"]


def _base_icosahedron() -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(5)
    rho, z = 2 / np.sqrt(5), 1 / np.sqrt(5)
    upper = np.stack([rho * np.cos(2 * np.pi * k / 5), rho * np.sin(2 * np.pi * k / 5), np.full(5, z)], 1)
    lower = np.stack(
        [rho * np.cos(2 * np.pi * (k + 0.5) / 5), rho * np.sin(2 * np.pi * (k + 0.5) / 5), np.full(5, -z)], 1
    )
    vertices = np.concatenate([[[0.0, 0.0, 1.0]], upper, lower, [[0.0, 0.0, -1.0]]])
    u, l, u1, l1 = 1 + k, 6 + k, 1 + (k + 1) % 5, 6 + (k + 1) % 5
    faces = np.concatenate(
        [
            np.stack([np.zeros(5, dtype=np.int64), u, u1], 1),
            np.stack([u, l, u1], 1),
            np.stack([l, l1, u1], 1),
            np.stack([np.full(5, 11), l1, l], 1),
        ]
    ).astype(np.int64)
    return vertices, faces


def _subdivide(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One level of hierarchical subdivision (see the module docstring for the order)."""
    n_v, n_f = len(vertices), len(faces)
    # Edges in walking order: face-major, then (v0 v1), (v1 v2), (v2 v0).
    a = faces.reshape(-1)
    b = np.roll(faces, -1, axis=1).reshape(-1)
    key = np.minimum(a, b) * n_v + np.maximum(a, b)
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    mid_id = (n_v + rank[inverse.reshape(-1)]).reshape(n_f, 3)  # m01, m12, m20 of every face
    lo, hi = uniq // n_v, uniq % n_v
    mid = vertices[lo] + vertices[hi]
    mid /= np.linalg.norm(mid, axis=1, keepdims=True)
    new_vertices = np.concatenate([vertices, mid[np.argsort(rank)]])
    v0, v1, v2 = faces.T
    m01, m12, m20 = mid_id.T
    children = np.stack(
        [
            np.stack([v0, m01, m20], 1),
            np.stack([m01, v1, m12], 1),
            np.stack([m20, m12, v2], 1),
            np.stack([m01, m12, m20], 1),
        ],
        1,
    )
    return new_vertices, children.reshape(4 * n_f, 3)


def spherical_triangle_area(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Solid angle of the spherical triangles with unit corners ``a, b, c [..., 3]``.

    Van Oosterom & Strackee (1983): ``tan(E / 2) = det[a, b, c] / (1 + a.b + b.c + c.a)``; signed,
    positive for counter-clockwise triangles seen from outside.
    """
    det = np.einsum("...i,...i->...", a, np.cross(b, c))
    den = 1 + np.einsum("...i,...i->...", a, b) + np.einsum("...i,...i->...", b, c) + np.einsum("...i,...i->...", c, a)
    return 2 * np.arctan2(det, den)


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, eq=False)
class Icosphere:
    """An icosphere of a given subdivision level; build it with :func:`icosphere`.

    Attributes (all read-only numpy arrays):
        level: subdivision level (0 = icosahedron).
        vertices: ``[V, 3]`` float64 unit vectors, ``V = 10 * 4**level + 2``.
        faces: ``[F, 3]`` int64 vertex indices, ``F = 20 * 4**level``, outward counter-clockwise.
        face_areas: ``[F]`` spherical (solid-angle) areas of the faces; they sum to 4 pi.
        vertex_areas: ``[V]`` quadrature weights, one third of the areas of the adjacent faces.
        face_centroids: ``[F, 3]`` normalized means of the face corners.

    See the module docstring for the vertex/face order.
    """

    level: int
    vertices: np.ndarray
    faces: np.ndarray
    face_areas: np.ndarray
    vertex_areas: np.ndarray
    face_centroids: np.ndarray

    def __repr__(self) -> str:
        return f"Icosphere(level={self.level}, vertices={self.num_vertices}, faces={self.num_faces})"

    @property
    def num_vertices(self) -> int:
        return len(self.vertices)

    @property
    def num_faces(self) -> int:
        return len(self.faces)

    @cached_property
    def _vertex_index(self) -> PointIndex:
        return PointIndex(self.vertices)

    @cached_property
    def _face_index(self) -> PointIndex:
        return PointIndex(self.face_centroids)

    def vertex_permutation(self, rotation: np.ndarray) -> np.ndarray:
        """int64 ``[V]`` with ``vertices[perm[i]] == rotation @ vertices[i]``.

        Raises ValueError if the vertex set is not closed under ``rotation`` (e.g. a rotation
        outside the icosahedral group).
        """
        return self._vertex_index.permutation(rotation)

    def face_permutation(self, rotation: np.ndarray) -> np.ndarray:
        """int64 ``[F]``: face i is mapped onto face ``perm[i]`` (as a set of vertices).

        Works for any orthogonal matrix that maps the icosphere onto itself, reflections included.
        """
        return self._face_index.permutation(rotation)

    def face_action(self, rotation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Face permutation and corner shift under a proper rotation.

        Returns ``(perm [F], shift [F])`` int64 with, for every face i and corner k in {0, 1, 2},

            ``faces[perm[i], (k + shift[i]) % 3] == vertex_permutation(rotation)[faces[i, k]]``

        i.e. corner k of face i lands on corner ``(k + shift[i]) % 3`` of its image, and corner
        ``(-shift[i]) % 3`` of face i lands on corner 0 of the image. A rotation keeps the
        counter-clockwise corner order, so one shift per face describes all three corners.

        Raises:
            ValueError: if ``det(rotation) < 0`` (a reflection reverses the corner order; use
                :meth:`face_permutation`) or the icosphere is not closed under ``rotation``.
        """
        rotation = np.asarray(rotation, dtype=np.float64)
        if rotation.shape == (3, 3) and np.linalg.det(rotation) < 0:
            raise ValueError("face_action needs a proper rotation (det = +1); got det < 0")
        vperm = self.vertex_permutation(rotation)
        perm = self.face_permutation(rotation)
        image = vperm[self.faces]  # [F, 3] images of the corners
        target = self.faces[perm]
        shift = np.argmax(target == image[:, :1], axis=1).astype(np.int64)
        k = np.arange(3)
        rolled = np.take_along_axis(target, (k[None, :] + shift[:, None]) % 3, axis=1)
        if not np.array_equal(rolled, image):
            bad = int(np.sum(np.any(rolled != image, axis=1)))
            raise ValueError(f"{bad} faces are not mapped corner-to-corner onto a face by this matrix")
        return perm, shift


@lru_cache(maxsize=8)
def _icosphere(level: int) -> Icosphere:
    vertices, faces = _base_icosahedron()
    for _ in range(level):
        vertices, faces = _subdivide(vertices, faces)
    corners = vertices[faces]
    face_areas = spherical_triangle_area(corners[:, 0], corners[:, 1], corners[:, 2])
    vertex_areas = np.bincount(faces.reshape(-1), weights=np.repeat(face_areas / 3, 3), minlength=len(vertices))
    centroids = corners.sum(1)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    return Icosphere(
        level=level,
        vertices=_readonly(vertices),
        faces=_readonly(faces),
        face_areas=_readonly(face_areas),
        vertex_areas=_readonly(vertex_areas),
        face_centroids=_readonly(centroids),
    )


def icosphere(level: int) -> Icosphere:
    """The icosphere with ``level`` subdivisions (cached; arrays are read-only).

    ``V = 10 * 4**level + 2`` vertices, ``F = 20 * 4**level`` faces; see the module docstring for
    the orientation and the hierarchical order.
    """
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or level < 0:
        raise ValueError(f"expected a non-negative integer icosphere level, got {level!r}")
    vertices = 10 * 4 ** int(level) + 2
    check_memory(
        f"icosphere level {level} ({vertices:,} vertices)",
        BYTES_PER_VERTEX * vertices,
        f"about {BYTES_PER_VERTEX} bytes a vertex while it is subdivided",
    )
    return _icosphere(int(level))


# Peak memory of building an icosphere per vertex, rounded down: the subdivision's arrays and temporaries.
BYTES_PER_VERTEX = 300
