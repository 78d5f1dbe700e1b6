"""Homogeneous-space (Fourier) nonlinearity (O(2) seed, Sec. 4.3, eq. 9-11).

For a G-set ``X = (+)_alpha n_alpha G/H_alpha`` the functions ``C(X, R)`` decompose into irreps
(eq. 9, the "Fourier transform" FT). The nonlinearity ``V' -> V'`` is ``FT o sigma o FT^-1``
(eq. 10): inverse FT to values on X, the pointwise ``sigma`` (GELU), FT back. Permutations commute
with pointwise maps, so it is equivariant; ``V'`` is fixed by X (``C'_rho = sum_alpha Gamma_rho^alpha n_alpha``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType

SpaceSpec = tuple[Sequence[int] | np.ndarray | str, int]
"""``(H, n)``: n copies of G/H; H as sorted element indices, ``"regular"`` ({e}) or ``"trivial"`` (G)."""


def _subgroup_indices(group: FiniteGroup, spec) -> np.ndarray:
    if isinstance(spec, str):
        if spec == "regular":
            return np.array([0])
        if spec == "trivial":
            return np.arange(group.order)
        raise ValueError(f"unknown homogeneous space {spec!r}; valid: 'regular', 'trivial' or subgroup indices")
    return np.asarray(spec, dtype=np.int64)


def homogeneous_fourier_basis(
    group: FiniteGroup, spaces: Sequence[SpaceSpec]
) -> tuple[FeatureType, np.ndarray, np.ndarray]:
    """The feature type of ``C(X, R)`` and its inverse Fourier transform.

    Returns:
        ``(ftype, basis, permutations)``: ``basis [|X|, ftype.dim]`` orthogonal with
        ``f = basis @ h`` the function on X with irrep coefficients ``h`` (eq. 9 inverted), and
        ``permutations [order, |X|]`` the action on X (``P(g) basis = basis rho_V'(g)``).
    """
    pieces = []  # (space offset, Q, irreps of Q's columns)
    perms = []
    offset = 0
    for spec, count in spaces:
        if count < 0:
            raise ValueError(f"homogeneous space counts must be non-negative, got {count}")
        hs = group.homogeneous_space(_subgroup_indices(group, spec))
        for _ in range(int(count)):
            pieces.append((offset, hs.fourier_basis, hs.representation.irreps))
            perms.append(hs.permutations + offset)
            offset += hs.size
    if not pieces:
        raise ValueError("expected at least one homogeneous space")
    names = [rho.name for rho in group.irreps]
    counts = [0] * len(names)
    for _, _, irreps in pieces:
        for rho in irreps:
            counts[names.index(rho.name)] += 1
    ftype = FeatureType(group, counts)
    basis = np.zeros((offset, ftype.dim))
    next_copy = [0] * len(names)
    for start, Q, irreps in pieces:
        col = 0
        for rho in irreps:
            i = names.index(rho.name)
            first = int(ftype.offsets[i]) + next_copy[i] * rho.dim
            basis[start : start + len(Q), first : first + rho.dim] = Q[:, col : col + rho.dim]
            next_copy[i] += 1
            col += rho.dim
    return ftype, basis, np.concatenate(perms, axis=1)


class FourierActivation(ExactBuffers):
    """``h -> FT(sigma(FT^-1 h))`` on ``[..., ftype.dim]`` (eq. 10).

    Args:
        ftype: the feature type ``V'`` (must be the one of ``C(X, R)``).
        basis: ``[|X|, ftype.dim]`` inverse Fourier transform (:func:`homogeneous_fourier_basis`).
        act: the pointwise nonlinearity (default GELU).
    """

    def __init__(self, ftype: FeatureType, basis: np.ndarray, act: nn.Module | None = None) -> None:
        super().__init__()
        basis = np.asarray(basis, dtype=np.float64)
        if basis.shape[1] != ftype.dim:
            raise ValueError(f"expected a basis with {ftype.dim} columns for {ftype}, got {list(basis.shape)}")
        self.ftype = ftype
        self.register_exact_buffer("basis", torch.from_numpy(basis))
        self.act = act if act is not None else nn.GELU()

    @classmethod
    def from_spaces(
        cls, group: FiniteGroup, spaces: Sequence[SpaceSpec], act: nn.Module | None = None
    ) -> FourierActivation:
        ftype, basis, _ = homogeneous_fourier_basis(group, spaces)
        return cls(ftype, basis, act)

    def extra_repr(self) -> str:
        return f"{self.ftype}, |X|={self.basis.shape[0]}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x @ self.basis.T) @ self.basis
