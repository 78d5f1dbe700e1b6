"""Tokenizers that lift inputs to regular features on a group of frames (Platonic Transformer seed).

Each returns tokens ``[B, N, |G| * C]`` (frames-major) and the token positions frame RoPE reads:

- :class:`LiftedSquarePatchEmbed`: square images; frame R sees each patch rotated by R^-1 (a lifting
  convolution with one kernel steered to every frame), positions = patch centres;
- :class:`LiftedPointEmbed`: point clouds; per-point scalars copied over frames plus the centred
  position seen from each frame ``R^-1 (p - mean p)``, positions = the points;
- :class:`LiftedIcosphereEmbed`: icosphere fields; the SO3ViT lifting convolution gives invariant
  scalars per oriented patch token, and the token's pose axes seen from each frame add the
  orientation, positions = patch centroid directions.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eqvit.geometry.points import point_permutation
from eqvit.groups import FiniteGroup
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.init import vit_linear
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.regular import LiftToGroup, RegularBasis
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed
from eqvit.nn.tokenizers.square import square_patch_layout


class LiftedSquarePatchEmbed(ExactBuffers):
    """``[B, C_in, S, S] -> [B, (S/P)^2, |G| * C]``: ``f_i(R) = sum_u W(u) x(c_i + R u) + b``.

    One kernel ``W [C, C_in, P, P]``; frame R uses it with the patch pixels permuted by R (the
    square patch is closed under D4), so all frames are one strided convolution with ``|G| C``
    output channels, the cost of a timm patch embedding of width ``|G| C``. Rotating the image by
    g moves patch i to the patch at ``g c_i`` and frame R there sees what frame ``g^-1 R`` saw.
    With ``basis="fourier"`` the tokens are the frames' Fourier coefficients
    (:class:`~eqvit.nn.regular.RegularBasis`): the change of basis is folded into the steered kernels.

    Args:
        group: frames, a subgroup of D4 given as 2x2 matrices (C1, C2, C4, D1, D2, D4).
        img_size, patch_size: S and P (S a multiple of P).
        in_chans, channels: C_in and C per frame.
        basis: ``"frames"`` or ``"fourier"``.
    """

    def __init__(
        self, group: FiniteGroup, img_size: int, patch_size: int, in_chans: int, channels: int, basis: str = "frames"
    ) -> None:
        super().__init__()
        if basis not in ("frames", "fourier"):
            raise ValueError(f"unknown basis {basis!r}; valid: frames, fourier")
        if group.dim != 2:
            raise ValueError(f"square images need planar frames (2x2 matrices), got {group.name} in {group.dim}-D")
        offsets, centers, _ = square_patch_layout(img_size, patch_size)
        try:
            # steer[g, v] = pixel u with u = R_g^-1 v, so the frame-g kernel is W(R_g^-1 v).
            steer = np.stack([point_permutation(offsets, R.T) for R in group.elements])
        except ValueError as err:
            raise ValueError(
                f"frames {group.name} do not map the square patch onto itself: use a subgroup of D4"
            ) from err
        self.order, self.in_chans, self.channels = group.order, in_chans, channels
        self.img_size, self.patch_size = img_size, patch_size
        self.register_buffer("steer", torch.from_numpy(steer), persistent=False)
        self.weight = nn.Parameter(torch.empty(channels, in_chans, patch_size * patch_size))
        self.bias = nn.Parameter(torch.zeros(channels))
        nn.init.trunc_normal_(self.weight, std=0.02)
        # Patch centres in patch units (x right, y up), row-major like the conv output.
        self.positions = torch.from_numpy(centers / patch_size)
        self.in_type = FeatureType.trivial(group, in_chans)  # each input channel a scalar field on the pixels
        if basis == "frames":
            self.out_type = FeatureType.frames(group, channels)
            self._steer = _frame_kernels
        else:
            fourier = RegularBasis(group, channels)
            self.out_type = fourier.ftype
            # coefficients [s, C] = Q^T frames [G, C]: the kernels' frame axis mixed once per call
            self.register_exact_buffer("from_frames", torch.from_numpy(np.ascontiguousarray(fourier.q.T)))
            self._steer = _coefficient_kernels

    @property
    def num_tokens(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    def frame_weight(self) -> torch.Tensor:
        """``[|G| C, C_in, P, P]``: the kernel as seen by every frame, frames-major."""
        # Frame g's kernel at offset v is W(R_g^-1 v): gather through steer[g, v].
        w = self.weight[:, :, self.steer]  # [C, C_in, G, P^2]
        P = self.patch_size
        return w.permute(2, 0, 1, 3).reshape(self.order * self.channels, self.in_chans, P, P)

    def steered_weight(self) -> torch.Tensor:
        """``([|G| C, C_in, P, P], [|G| C])``: the convolution's kernels and bias in the output basis."""
        return self._steer(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lift_square_patches(x, *self.steered_weight(), self.patch_size)

    def fold(self) -> nn.Module:
        """The inference form: the steered kernels fixed."""
        from eqvit.nn.folded import FoldedSquareLift

        return FoldedSquareLift(self)


def lift_square_patches(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``[B, C_in, S, S] -> [B, (S/P)^2, |G| C]``: the strided convolution with the steered kernels."""
    out = F.conv2d(x, weight, bias, stride=patch_size)
    # Token-major and contiguous: a transposed view would keep the whole residual stream transposed.
    return out.flatten(2).transpose(1, 2).contiguous()


def _frame_kernels(embed: LiftedSquarePatchEmbed) -> tuple[torch.Tensor, torch.Tensor]:
    return embed.frame_weight(), embed.bias.repeat(embed.order)


def _coefficient_kernels(embed: LiftedSquarePatchEmbed) -> tuple[torch.Tensor, torch.Tensor]:
    G, C = embed.order, embed.channels
    frames, bias = _frame_kernels(embed)
    weight = torch.matmul(embed.from_frames, frames.view(G, -1)).view_as(frames)
    return weight, torch.matmul(embed.from_frames, bias.view(G, C)).flatten()


class CentredPoints(nn.Module):
    """The input encoding of point-cloud models: ``(pos [B, N, d], feat) -> (pos - mean(pos), feat)``.

    Centring makes every model after it exactly translation invariant (and leaves rotations about
    the origin acting as before).
    """

    def forward(self, pos: torch.Tensor, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return pos - pos.mean(dim=1, keepdim=True), feat


class LiftedPointEmbed(nn.Module):
    """``(pos [B, N, d], feat [B, N, C_in]) -> [B, N, |G| * C]``, ``pos`` centred by the caller.

    ``f_i(R) = A feat_i + V R^-1 p_i + b``: the scalar features are the same in every frame, the
    (centred) position is seen from each frame (seed Sec. 3.1 lifting of vectors). Rotation
    equivariant and permutation equivariant over the points.
    """

    def __init__(self, group: FiniteGroup, in_chans: int, channels: int) -> None:
        super().__init__()
        self.order, self.dim = group.order, group.dim
        # The atom features are invariant; the positions (the other input) are vectors, lifted to the frames.
        self.in_type, self.out_type = FeatureType.trivial(group, in_chans), FeatureType.frames(group, channels)
        self.lift = LiftToGroup(group)
        self.scalar_proj = vit_linear(in_chans, channels)
        self.vector_proj = vit_linear(group.dim, channels, bias=False)

    def forward(self, pos: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        seen = self.lift(vectors=pos.unsqueeze(-2)).unflatten(-1, (self.order, self.dim))  # [B, N, G, d]
        return (self.vector_proj(seen) + self.scalar_proj(feat).unsqueeze(-2)).flatten(-2)


class LiftedIcosphereEmbed(ExactBuffers):
    """``x [B, C_in, V] -> [B, 3M, |G| * C]`` on icosphere patches (the SO3ViT lifting).

    ``f_t(R) = s_t + A [R^-1 e1_t, R^-1 e3_t]``: ``s_t`` the lifting convolution of token t (an
    invariant scalar, since a symmetry g maps token t's kernel lattice onto token t''s), and the
    pose axes (towards the starting corner, the centroid) seen from each frame.
    """

    def __init__(self, group: FiniteGroup, in_chans: int, channels: int, input_level: int, patch_level: int) -> None:
        super().__init__()
        self.order = group.order
        self.in_type, self.out_type = FeatureType.trivial(group, in_chans), FeatureType.frames(group, channels)
        self.embed = IcospherePatchEmbed(in_chans, channels, input_level, patch_level)
        self.axes_proj = vit_linear(6, channels, bias=False)
        poses = self.embed.poses  # [3M, 3, 3] float64, columns (e1, e2, e3)
        axes = poses[:, :, [0, 2]].transpose(1, 2)  # [3M, 2, 3]
        # Fixed geometry: the axes seen from every frame are lifted once, in float64.
        seen = LiftToGroup(group).double()(vectors=axes).unflatten(-1, (group.order, 6))  # [3M, G, 6]
        self.register_exact_buffer("seen_axes", seen)
        self.positions = poses[:, :, 2].clone()  # centroid directions [3M, 3]

    @property
    def num_tokens(self) -> int:
        return self.embed.num_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scalars = self.embed(x)  # [B, 3M, C]
        return (scalars.unsqueeze(-2) + self.axes_proj(self.seen_axes)).flatten(-2)
