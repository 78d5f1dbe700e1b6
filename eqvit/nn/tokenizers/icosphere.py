"""Icosphere patches lifted to tokens on SO(3) (SO(3)-RoPE seed, Sec. 3, Defs. 4-5).

The patches are the faces of ``icosphere(patch_level)``. With the hierarchical subdivision each
patch holds the ``(n+1)(n+2)/2`` vertices of ``icosphere(input_level)`` on a triangular lattice,
``n = 2^(input_level - patch_level)``. A triangular kernel is applied in each of the patch's 3
orientations (starting corner 0, 1, 2, corners counter-clockwise), giving 3M tokens. Token
(f, s) has pose ``R = [e1, e2, e3]`` with e3 the patch centroid direction and e1 the tangent
direction towards the starting corner: a rotation-covariant function of the patch, so an
icosahedral rotation g maps each token's pose exactly to another token's pose g R, and the
kernel's lattice to that token's lattice. No interpolation anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eqvit.geometry.icosphere import icosphere
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.init import vit_linear


@dataclass(frozen=True)
class IcosphereLifting:
    """Precomputed geometry of the lifting: which vertex each kernel tap reads, and the poses.

    Attributes:
        input_level, patch_level: icosphere levels of the input grid and of the patches.
        gather_index: int64 ``[3M, P]``: vertex read by tap p of token t (token t = 3 f + s).
        poses: float64 ``[3M, 3, 3]`` token rotations.
        lattice: int64 ``[P, 2]``: the barycentric lattice coordinates (i, j) of each tap.
        orientation_taps: int64 ``[3, P]``: the three tokens of a patch read the same vertices, their
            lattice turned by 120 degrees: tap ``orientation_taps[s, q]`` of token (f, s) reads what tap
            q of token (f, 0) reads, i.e. ``gather_index[3 f + s, orientation_taps[s]] == gather_index[3 f]``.
    """

    input_level: int
    patch_level: int
    gather_index: np.ndarray
    poses: np.ndarray
    lattice: np.ndarray
    orientation_taps: np.ndarray

    @property
    def num_tokens(self) -> int:
        return len(self.gather_index)

    @property
    def face_index(self) -> np.ndarray:
        """int64 ``[M, P]``: the vertex read by tap q of patch f in its orientation 0 (token 3 f)."""
        return self.gather_index[0::3]

    @property
    def taps(self) -> int:
        return self.gather_index.shape[1]


def _pose(corners: np.ndarray) -> np.ndarray:
    """Rotation ``[3, 3]`` whose columns are (towards corner 0, e3 x e1, centroid direction)."""
    e3 = corners.mean(0)
    e3 /= np.linalg.norm(e3)
    e1 = corners[0] - (corners[0] @ e3) * e3
    e1 /= np.linalg.norm(e1)
    return np.stack([e1, np.cross(e3, e1), e3], axis=1)


@lru_cache(maxsize=16)
def icosphere_lifting(input_level: int, patch_level: int) -> IcosphereLifting:
    """The lifting geometry for ``input_level >= patch_level >= 0`` (cached)."""
    if not (0 <= patch_level <= input_level):
        raise ValueError(
            f"need 0 <= patch_level <= input_level, got patch_level={patch_level}, input_level={input_level}"
        )
    fine, coarse = icosphere(input_level), icosphere(patch_level)
    depth = input_level - patch_level
    n = 2**depth
    lattice = np.array([(i, j) for i in range(n + 1) for j in range(n + 1 - i)], dtype=np.int64)
    fine_per_patch = 4**depth
    gather, poses = [], []
    for f, corner_idx in enumerate(coarse.faces):
        members = np.unique(fine.faces[f * fine_per_patch : (f + 1) * fine_per_patch])
        candidates = fine.vertices[members]
        for s in range(3):
            corners = coarse.vertices[np.roll(corner_idx, -s)]
            targets = (
                corners[0]
                + (lattice[:, :1] / n) * (corners[1] - corners[0])
                + (lattice[:, 1:] / n) * (corners[2] - corners[0])
            )
            targets /= np.linalg.norm(targets, axis=1, keepdims=True)
            # The subdivided vertices sit near (not exactly at) the projected flat lattice;
            # nearest-vertex matching is still exact and rotation covariant.
            nearest = np.argmax(targets @ candidates.T, axis=1)
            if len(np.unique(nearest)) != len(lattice):
                raise RuntimeError(f"lattice of patch {f} is not a bijection onto its vertices")
            gather.append(members[nearest])
            poses.append(_pose(corners))
    gather_index, pose_array = np.stack(gather), np.stack(poses)
    orientation_taps = _orientation_taps(gather_index)
    for array in (gather_index, pose_array, lattice, orientation_taps):
        array.setflags(write=False)
    return IcosphereLifting(input_level, patch_level, gather_index, pose_array, lattice, orientation_taps)


def _orientation_taps(gather_index: np.ndarray) -> np.ndarray:
    """``[3, P]``: for each orientation s, the tap of token (f, s) that reads tap q of token (f, 0); the same
    for every patch (rolling the corners relabels the barycentric lattice, whatever the patch's shape)."""
    per_patch = gather_index.reshape(-1, 3, gather_index.shape[1])
    first = per_patch[0]
    taps = []
    for s in range(3):
        tap_of = {vertex: tap for tap, vertex in enumerate(first[s])}
        taps.append([tap_of[vertex] for vertex in first[0]])
    taps = np.array(taps, dtype=np.int64)
    for s in range(3):
        if not np.array_equal(per_patch[:, s][:, taps[s]], per_patch[:, 0]):
            raise RuntimeError("the three orientations of a patch do not read its vertices in one lattice rotation")
    return taps


def _orientation_tap_index(lifting: IcosphereLifting) -> torch.Tensor:
    """``lifting.orientation_taps`` flat, ``[3 P]``: the index that turns a kernel's taps per orientation."""
    return torch.from_numpy(lifting.orientation_taps.reshape(-1).copy())


def _positions(*shape: int) -> torch.Tensor:
    """``arange`` over ``shape``: permuting it gives the flat index of that permutation."""
    return torch.arange(math.prod(shape)).view(shape)


class IcospherePatchEmbed(nn.Module):
    """Lifting convolution: ``x [B, C, V]`` on ``icosphere(input_level)`` -> tokens ``[B, 3M, D]``.

    The three tokens of a patch read the same vertices with the kernel turned by 120 degrees, so each
    patch is gathered once and projected by the three turned kernels at once (one ``[M, P C] @ [P C, 3 D]``
    matmul): a third of the gather of one token at a time, the same multiply-adds.

    Args:
        in_chans: C.
        embed_dim: D.
        input_level, patch_level: see :func:`icosphere_lifting`.
    """

    def __init__(self, in_chans: int, embed_dim: int, input_level: int = 5, patch_level: int = 2) -> None:
        super().__init__()
        self.lifting = icosphere_lifting(input_level, patch_level)
        self.in_chans = in_chans
        self.num_vertices = len(icosphere(input_level).vertices)
        face_index = torch.from_numpy(self.lifting.face_index.reshape(-1).copy())
        self.register_buffer("face_index", face_index, persistent=False)  # [M P], patch-major
        self.proj = vit_linear(in_chans * self.lifting.taps, embed_dim)
        # Where each entry of the turned weights [3 D, P C] sits in proj.weight [D, C P]: one flat gather.
        D, C, P = embed_dim, in_chans, self.lifting.taps
        taps = _orientation_tap_index(self.lifting)
        turned = _positions(D, C, P).index_select(2, taps).view(D, C, 3, P).permute(2, 0, 3, 1)
        self.register_buffer("turned_index", turned.reshape(-1), persistent=False)

    @property
    def num_tokens(self) -> int:
        return self.lifting.num_tokens

    @property
    def poses(self) -> torch.Tensor:
        """float64 ``[3M, 3, 3]`` token poses."""
        return torch.from_numpy(self.lifting.poses.copy())

    def turned_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The projection for the three orientations: ``W [3 D, P C]`` (rows (s, d), columns tap-major
        (q, c) over a patch's orientation-0 taps) and ``b [3 D]``."""
        weight = self.proj.weight.reshape(-1).index_select(0, self.turned_index)
        # expand + reshape, not repeat: repeat costs more than the whole gather here
        return weight.view(3 * self.proj.out_features, -1), self.proj.bias.expand(3, -1).reshape(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, C, V] -> tokens [B, 3M, D]``."""
        return lift_patches(x, self.face_index, *self.turned_weights())

    def fold(self) -> nn.Module:
        """The inference form: the three turned kernels fixed."""
        from eqvit.nn.folded import FoldedIcosphereLift

        return FoldedIcosphereLift(self)


def lift_patches(x: torch.Tensor, face_index: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x [B, C, V]``, ``face_index [M P]`` (patch-major taps), turned ``weight [3 D, P C]``, ``bias [3 D]``
    -> tokens ``[B, 3M, D]`` (the forward of :class:`IcospherePatchEmbed` and of its inference form)."""
    B, C, _ = x.shape
    M = face_index.numel() * C // weight.shape[1]
    # Whole vertices (all C channels) gathered tap-major: one row gather, no permuted copy.
    patches = x.transpose(1, 2).index_select(1, face_index).view(B, M, weight.shape[1])
    # Row (f, s d) of the output is token 3 f + s: the view to [B, 3M, D] is free.
    return F.linear(patches, weight, bias).view(B, 3 * M, weight.shape[0] // 3)


class IcosphereUnpatchify(ExactBuffers):
    """Projection convolution (transposed lifting): tokens ``[B, 3M, D]`` -> ``[B, C_out, V]``.

    Every token writes a triangular kernel onto its patch's lattice in its own orientation;
    each vertex averages what it receives (vertices on patch edges and corners are shared). The three
    tokens of a patch write onto the same vertices, so their kernels are summed per patch in one matmul
    (``[C_out P, 3 D] @ [3 D, M]``) and only the patches are scattered.
    """

    def __init__(self, embed_dim: int, out_chans: int, input_level: int = 5, patch_level: int = 2) -> None:
        super().__init__()
        self.lifting = icosphere_lifting(input_level, patch_level)
        self.out_chans = out_chans
        V = len(icosphere(input_level).vertices)
        self.num_vertices = V
        # Tap-major (q, f): the matmul's output rows (c, q) then land as [C, P M] without a permute.
        index = torch.from_numpy(self.lifting.face_index.T.reshape(-1).copy())
        # Each patch vertex receives from the patch's three tokens.
        counts = 3 * torch.bincount(index, minlength=V).double()
        if (counts == 0).any():
            raise RuntimeError("some vertices are not covered by any patch")
        self.register_buffer("scatter_index", index, persistent=False)
        self.register_exact_buffer("inv_count", 1.0 / counts)  # exact in float64 models too
        self.proj = vit_linear(embed_dim, out_chans * self.lifting.taps)
        # Where each entry of the turned weights [C_out P, 3 D] (and the biases [C_out, 3, P]) sits in proj.
        C, P, D = out_chans, self.lifting.taps, embed_dim
        taps = _orientation_tap_index(self.lifting)
        turned = _positions(C, P, D).index_select(1, taps).view(C, 3, P, D).transpose(1, 2)
        self.register_buffer("turned_index", turned.reshape(-1), persistent=False)
        self.register_buffer("turned_bias_index", _positions(C, P).index_select(1, taps).view(-1), persistent=False)

    def turned_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The three orientations' kernels on a patch's orientation-0 taps, side by side: ``W [C_out P, 3 D]``
        (rows (c, q), columns (s, d)) and their summed bias ``b [C_out P]``."""
        C, P = self.out_chans, self.lifting.taps
        weight = self.proj.weight.reshape(-1).index_select(0, self.turned_index).view(C * P, -1)
        bias = self.proj.bias.index_select(0, self.turned_bias_index).view(C, 3, P).sum(1)
        return weight, bias.reshape(C * P)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, 3M, D] -> [B, C_out, V]``."""
        return unpatchify_patches(tokens, *self.turned_weights(), self.scatter_index, self.inv_count)

    def fold(self) -> nn.Module:
        """The inference form: the turned kernels and summed biases fixed."""
        from eqvit.nn.folded import FoldedIcosphereUnpatchify

        return FoldedIcosphereUnpatchify(self)


def unpatchify_patches(
    tokens: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, scatter_index: torch.Tensor, inv_count: torch.Tensor
) -> torch.Tensor:
    """``tokens [B, 3M, D]``, turned ``weight [C P, 3 D]``, summed ``bias [C P]``, tap-major ``scatter_index
    [P M]``, ``inv_count [V]`` -> ``[B, C, V]`` (the forward of :class:`IcosphereUnpatchify` and of its
    inference form)."""
    B, N, D = tokens.shape
    # Channels-first patch values [B, C P, M] = W patches^T + b from one (batched) matmul: a patch's
    # three tokens are one row of [B, M, 3 D], and the rows (c, q) need no permuted copy to scatter.
    patches = tokens.reshape(B, N // 3, 3 * D).transpose(1, 2)
    values = torch.baddbmm(bias[:, None], weight.expand(B, -1, -1), patches)
    C = weight.shape[0] * (N // 3) // scatter_index.numel()
    values = values.view(B, C, scatter_index.numel())  # [B, C, P M]
    # values, not tokens: under autocast the projection is bf16 while the tokens may be fp32 (a learned APE).
    out = values.new_zeros(B, C, inv_count.numel()).index_add_(2, scatter_index, values)
    return out * inv_count.to(out.dtype)
