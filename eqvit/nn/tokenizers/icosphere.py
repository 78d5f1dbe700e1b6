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

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eqvit.geometry.icosphere import icosphere
from eqvit.nn.init import vit_linear


@dataclass(frozen=True)
class IcosphereLifting:
    """Precomputed geometry of the lifting: which vertex each kernel tap reads, and the poses.

    Attributes:
        input_level, patch_level: icosphere levels of the input grid and of the patches.
        gather_index: int64 ``[3M, P]``: vertex read by tap p of token t (token t = 3 f + s).
        poses: float64 ``[3M, 3, 3]`` token rotations.
        lattice: int64 ``[P, 2]``: the barycentric lattice coordinates (i, j) of each tap.
    """

    input_level: int
    patch_level: int
    gather_index: np.ndarray
    poses: np.ndarray
    lattice: np.ndarray

    @property
    def num_tokens(self) -> int:
        return len(self.gather_index)

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
    gather_index.setflags(write=False)
    pose_array.setflags(write=False)
    lattice.setflags(write=False)
    return IcosphereLifting(input_level, patch_level, gather_index, pose_array, lattice)


class IcospherePatchEmbed(nn.Module):
    """Lifting convolution: ``x [B, C, V]`` on ``icosphere(input_level)`` -> tokens ``[B, 3M, D]``.

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
        self.register_buffer("gather_index", torch.from_numpy(self.lifting.gather_index.copy()), persistent=False)
        self.register_buffer("tap_index", self.gather_index.reshape(-1).clone(), persistent=False)  # [3M P]
        self.proj = vit_linear(in_chans * self.lifting.taps, embed_dim)

    @property
    def num_tokens(self) -> int:
        return self.lifting.num_tokens

    @property
    def poses(self) -> torch.Tensor:
        """float64 ``[3M, 3, 3]`` token poses."""
        return torch.from_numpy(self.lifting.poses.copy())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, C, V] -> tokens [B, 3M, D]``."""
        B, C, _ = x.shape
        P = self.lifting.taps
        # Whole vertices (all C channels) gathered tap-major: one row gather, no permuted copy; the
        # projection's columns (channel-major, C P) are read in that tap-major order instead.
        patches = x.transpose(1, 2).index_select(1, self.tap_index).view(B, self.num_tokens, P * C)
        weight = self.proj.weight.view(-1, C, P).transpose(1, 2).reshape(-1, P * C)
        return F.linear(patches, weight, self.proj.bias)


class IcosphereUnpatchify(nn.Module):
    """Projection convolution (transposed lifting): tokens ``[B, 3M, D]`` -> ``[B, C_out, V]``.

    Every token writes a triangular kernel onto its patch's lattice in its own orientation;
    each vertex averages what it receives (vertices on patch edges and corners are shared).
    """

    def __init__(self, embed_dim: int, out_chans: int, input_level: int = 5, patch_level: int = 2) -> None:
        super().__init__()
        self.lifting = icosphere_lifting(input_level, patch_level)
        self.out_chans = out_chans
        V = len(icosphere(input_level).vertices)
        self.num_vertices = V
        # Tap-major (p, n): the projection's output rows (c, p) then land as [C, P N] without a permute.
        index = torch.from_numpy(self.lifting.gather_index.T.reshape(-1).copy())
        counts = torch.bincount(index, minlength=V).double()
        if (counts == 0).any():
            raise RuntimeError("some vertices are not covered by any patch")
        self.register_buffer("scatter_index", index, persistent=False)
        self.register_buffer("inv_count", (1.0 / counts).float(), persistent=False)
        self.proj = vit_linear(embed_dim, out_chans * self.lifting.taps)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, 3M, D] -> [B, C_out, V]``."""
        B, N, _ = tokens.shape
        # Channels-first values [B, C_out P, N] = W tokens^T + b straight from one (batched) matmul: the
        # rows (c, p) of the projection and the tap-major scatter index need no permuted copy.
        weight = self.proj.weight.expand(B, -1, -1)
        values = torch.baddbmm(self.proj.bias[:, None], weight, tokens.transpose(1, 2))
        values = values.view(B, self.out_chans, N * self.lifting.taps)
        # values, not tokens: under autocast the projection is bf16 while the tokens may be fp32 (a learned APE).
        out = values.new_zeros(B, self.out_chans, self.num_vertices).index_add_(2, self.scatter_index, values)
        return out * self.inv_count.to(out.dtype)
