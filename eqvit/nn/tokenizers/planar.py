"""Equivariant patch embedding on G-patchified grids (O(2) seed, Def. 3, Sec. 4.2.1).

A G-patchified grid is ``H0 = U + H`` with ``U`` (base patch) and ``H`` (patch centres) both
G-stable. The unfold ``P: C(H0, R^c) -> C(H, C(U, R^c))`` is G-equivariant (eq. 6); each patch is
then mapped by one G-equivariant linear map ``C(U, R^c) -> V`` (eq. 7). The map goes through a
precomputed irrep-adapted orthonormal basis ``E^rho_{alpha j}`` of ``C(U, R)`` (the decomposition of
U's permutation representation), so ``C(U, R^c)`` becomes an irrep-wise feature type with
``c * nu_rho`` copies of rho, and the learnable part is an :class:`~eqvit.nn.linear.IrrepLinear`
(its weights are the seed's ``K^rho``). The filters ``W E`` are one matmul per call (fixed by
``eqvit.fold`` for inference), and patches are embedded with one ``F.linear`` (a strided
``F.conv2d`` for square patches).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eqvit.geometry.points import permutations_for
from eqvit.groups import FiniteGroup
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import IrrepLinear


def permutation_fourier_basis(group: FiniteGroup, perms: np.ndarray) -> tuple[list, np.ndarray]:
    """Irrep decomposition of a permutation representation, orbit by orbit.

    Each orbit of ``perms [order, K]`` (``perms[g, k]`` = image of point k) is a homogeneous space
    G/S with S the stabiliser of its first point, so its block of the basis is that space's
    Fourier basis (``HomogeneousSpace.fourier_basis``) with cosets ``g S`` placed at ``g . u0``.

    Returns:
        ``(irreps, Q)``: ``Q [K, K]`` orthogonal, its columns grouped by irrep copy in the order
        of ``irreps``, with ``P(g) Q = Q blockdiag(irreps(g))``.
    """
    K = perms.shape[1]
    seen = np.zeros(K, dtype=bool)
    irreps, blocks = [], []
    for u0 in range(K):
        if seen[u0]:
            continue
        stabiliser = np.flatnonzero(perms[:, u0] == u0)
        space = group.homogeneous_space(stabiliser)
        points = perms[space.representatives, u0]  # coset x = g_x S sits at g_x . u0
        seen[points] = True
        block = np.zeros((K, space.size))
        block[points] = space.fourier_basis
        irreps += space.representation.irreps
        blocks.append(block)
    return irreps, np.concatenate(blocks, axis=1)


def patch_filter_basis(
    group: FiniteGroup, offsets: np.ndarray, in_chans: int, layout: str = "copies"
) -> tuple[FeatureType, np.ndarray]:
    """The irrep-adapted filter basis of ``C(U, R^in_chans)``, its coefficients in ``layout``.

    Returns:
        ``(ftype, B)``: ``ftype`` has ``in_chans * nu_rho`` copies of rho and ``B [ftype.dim,
        in_chans * K]`` is orthogonal with ``B @ patch`` the irrep coefficients of a patch
        flattened channel-major (``patch[c * K + k]``); ``B P_U(g) = ftype.rep(g) B``.
    """
    perms = permutations_for(offsets, group.elements)
    rep_irreps, Q = permutation_fourier_basis(group, perms)  # columns = E^rho_{alpha j} by irrep copy
    K = len(offsets)
    nu = {rho.name: 0 for rho in group.irreps}
    for rho in rep_irreps:
        nu[rho.name] += 1
    ftype = FeatureType(group, {name: in_chans * n for name, n in nu.items()}, layout=layout)
    names = [rho.name for rho in group.irreps]
    cols: dict[str, list[int]] = {name: [] for name in names}  # first column of each copy
    col = 0
    for rho in rep_irreps:
        cols[rho.name].append(col)
        col += rho.dim
    B = np.zeros((ftype.dim, in_chans * K))
    for i, rho, _, _ in ftype.blocks():
        n, coords = nu[rho.name], ftype.block_coords(i)  # [copies, d], in the layout's order
        for c in range(in_chans):
            for a, first in enumerate(cols[rho.name]):
                B[coords[c * n + a], c * K : (c + 1) * K] = Q[:, first : first + rho.dim].T
    return ftype, B


class GroupPatchEmbed(ExactBuffers):
    """``patches [B, M, in_chans * K] -> tokens [B, M, out_type.dim]`` (eq. 7).

    The filters ``F = W E [out.dim, in_chans * K]`` and the bias are derived on every call
    (:meth:`dense`); :meth:`fold` fixes them.

    Args:
        group: G (must map ``offsets`` onto itself).
        offsets: ``[K, 2]`` base-patch pixel offsets U.
        in_chans: input channels.
        out_type: token feature type V.
    """

    def __init__(self, group: FiniteGroup, offsets: np.ndarray, in_chans: int, out_type: FeatureType) -> None:
        super().__init__()
        # the patch's coefficients in the tokens' layout: in ``components`` the embedding is a Schur linear, and
        # its filters W E are built slab by slab (dense(): a fifth of the multiply-adds at ViT-S, no gather)
        self.in_type, basis = patch_filter_basis(group, offsets, in_chans, out_type.layout)
        self.register_exact_buffer("filter_basis", torch.from_numpy(basis))
        self.proj = IrrepLinear(self.in_type, out_type)
        self.out_type = out_type

    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(filters [out.dim, in_chans * K], bias [out.dim] or None)``, derived on every call."""
        proj = self._modules["proj"]
        return proj.matmul(self._buffers["filter_basis"]), proj.bias_vector()

    def filters(self) -> torch.Tensor:
        """``[out.dim, in_chans * K]`` the learned filters ``F = W E`` (seed, Sec. 4.2.1)."""
        return self.dense()[0]

    def filters_reference(self) -> torch.Tensor:
        """``W E`` with the block-wise reference matrix (no gather, no cache)."""
        return self.proj.weight_matrix_reference() @ self.filter_basis

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return F.linear(patches, *self.dense())

    def fold(self) -> nn.Module:
        """The inference form: the filters and bias fixed."""
        from eqvit.nn.folded import FoldedLinear

        return FoldedLinear(*self.dense(), in_type=self.in_type, out_type=self.out_type)


class ClassToken(nn.Module):
    """Prepends one class token, non-zero only on the trivial coordinates of ``out_type`` (seed, Sec. 4.5):
    ``[B, M, V.dim] -> [B, 1 + M, V.dim]``."""

    num_prefix_tokens = 1

    def __init__(self, out_type: FeatureType) -> None:
        super().__init__()
        self.in_type = self.out_type = out_type
        triv = torch.as_tensor(out_type.trivial_index, dtype=torch.int64)
        if len(triv) == 0:
            raise ValueError(f"a class token needs trivial irreps in {out_type}")
        # The token is ``cls_token @ cls_embedding``: one-hot rows [t, V.dim] put it on the trivial coordinates.
        embedding = torch.zeros(len(triv), out_type.dim)
        embedding[torch.arange(len(triv)), triv] = 1.0
        self.register_buffer("cls_embedding", embedding, persistent=False)
        self.cls_token = nn.Parameter(torch.randn(len(triv)) * 0.02)

    def token(self) -> torch.Tensor:
        """``[V.dim]`` the class token, zero outside the trivial irreps."""
        return self.cls_token @ self.cls_embedding

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token().expand(tokens.shape[0], 1, -1), tokens], dim=1)

    def fold(self) -> nn.Module:
        """The inference form: the token fixed."""
        from eqvit.nn.folded import FoldedClassToken

        return FoldedClassToken(self.token(), self.out_type)

    def fold_in_stream(self, basis: nn.Module) -> nn.Module:
        """The inference form prepending to tokens kept in ``basis`` (:class:`~eqvit.nn.stream.StreamBasis`)."""
        from eqvit.nn.folded import FoldedClassToken

        return FoldedClassToken(basis.to_stream(self.token()))


class PlanarTokenizer(nn.Module):
    """Unfold (eq. 6), equivariant patch embedding (eq. 7) and a class token in the trivial irreps (Sec. 4.5).

    Args:
        group: G.
        offsets: ``[K, 2]`` base patch U.
        centers: ``[M, 2]`` patch centres H (token order).
        patch_index: ``[M, K]`` input point read by pixel k of patch m (flattened input order).
        in_chans: input channels.
        out_type: token feature type V.
        class_token: prepend one token that is non-zero only in the trivial irrep.

    Input ``[B, in_chans, *spatial]`` (flattened row-major to the points); output ``[B, 1 + M, V.dim]``: the
    :meth:`patch_tokens`, then ``prefix`` (a :class:`ClassToken`, or the identity without one) prepends the class
    token.
    """

    def __init__(
        self,
        group: FiniteGroup,
        offsets: np.ndarray,
        centers: np.ndarray,
        patch_index: np.ndarray,
        in_chans: int,
        out_type: FeatureType,
        class_token: bool = True,
    ) -> None:
        super().__init__()
        self.group, self.in_chans, self.out_type = group, in_chans, out_type
        self.in_type = FeatureType.trivial(group, in_chans)  # each input channel a scalar field on the points
        self.offsets = np.asarray(offsets, dtype=np.float64)
        self.centers = np.asarray(centers, dtype=np.float64)
        self.num_tokens = len(self.centers)
        self.register_buffer("patch_index", torch.from_numpy(np.array(patch_index, dtype=np.int64)), persistent=False)
        self.embed = GroupPatchEmbed(group, self.offsets, in_chans, out_type)
        self.num_prefix_tokens = int(class_token)
        self.prefix = ClassToken(out_type) if class_token else nn.Identity()

    @property
    def cls_token(self) -> nn.Parameter | None:
        """The class token's trivial coordinates ``[t]`` (None without a class token)."""
        return getattr(self.prefix, "cls_token", None)

    def unfold(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, *spatial] -> [B, M, C * K]`` (channel-major within a patch)."""
        flat = x.flatten(2)[:, :, self.patch_index]  # [B, C, M, K]
        return flat.permute(0, 2, 1, 3).flatten(2)

    def patch_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, *spatial] -> [B, M, V.dim]``: unfold and embed (eq. 6-7), without the class token."""
        return self.patch_tokens_with(x, *self.embed.dense())

    def patch_tokens_with(self, x: torch.Tensor, filters: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """:meth:`patch_tokens` with given dense ``filters [D, in_chans * K]`` and ``bias [D]`` (e.g. a
        linear map of :meth:`GroupPatchEmbed.dense` folded in); ``[B, C, *spatial] -> [B, M, D]``."""
        return F.linear(self.unfold(x), filters, bias)

    def patch_tokens_reference(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`patch_tokens` by the generic gather-unfold and the block-wise reference filters."""
        flat = x.flatten(2)[:, :, self.patch_index].permute(0, 2, 1, 3).flatten(2)
        return F.linear(flat, self.embed.filters_reference(), self.embed.proj.bias_vector())

    def fold_in_stream(self, basis: nn.Module) -> PlanarTokenizer:
        """This tokenizer writing a residual stream kept in ``basis`` (:class:`~eqvit.nn.stream.StreamBasis`): the
        patch filters, bias and class token fixed and turned (a copy; the tokens it writes are no longer of
        :attr:`out_type`'s basis, so the copy declares none)."""
        from eqvit.nn.folded import FoldedLinear

        folded = copy.deepcopy(self)
        folded.embed = FoldedLinear(*basis.writing(*self.embed.dense()))
        folded.prefix = self.prefix.fold_in_stream(basis) if self.num_prefix_tokens else nn.Identity()
        folded.out_type = None
        return folded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, in_chans, *spatial] -> [B, num_prefix_tokens + M, V.dim]``."""
        return self.prefix(self.patch_tokens(x))
