"""Homogeneous spaces G/H of a finite group and their Fourier transform (O(2) seed, eq. 9)."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from eqvit.groups.irreps import Representation

if TYPE_CHECKING:
    from eqvit.groups.base import FiniteGroup


class HomogeneousSpace:
    """The G-set X = G/H of left cosets gH.

    Points are indexed by cosets in order of their first element (so point 0 is H itself).
    ``permutations[g, x]`` is the index of ``g . x``; the permutation representation acts on
    functions by ``(P(g) f)(g . x) = f(x)``, i.e. ``P(g)[g . x, x] = 1``.

    Args:
        group: the group G.
        subgroup: sorted indices of the stabilizer H.
    """

    def __init__(self, group: FiniteGroup, subgroup: np.ndarray) -> None:
        subgroup = np.unique(np.asarray(subgroup, dtype=np.int64))
        if not np.array_equal(group.closure(subgroup), subgroup):
            raise ValueError(f"indices {subgroup.tolist()} do not form a subgroup of {group.name}")
        self.group = group
        self.subgroup = subgroup
        coset_of = np.full(group.order, -1)
        representatives = []
        for g in range(group.order):
            if coset_of[g] < 0:
                coset_of[group.cayley[g, subgroup]] = len(representatives)
                representatives.append(g)
        self.representatives = np.array(representatives, dtype=np.int64)
        self.coset_of = coset_of
        # g . (g_x H) = (g g_x) H
        self.permutations = coset_of[group.cayley[:, self.representatives]]

    @property
    def size(self) -> int:
        return len(self.representatives)

    def __repr__(self) -> str:
        return f"HomogeneousSpace({self.group.name}/H{len(self.subgroup)}, size={self.size})"

    @cached_property
    def permutation_matrices(self) -> np.ndarray:
        """``[order, size, size]`` with ``P[g][g . x, x] = 1``."""
        P = np.zeros((self.group.order, self.size, self.size))
        g, x = np.meshgrid(np.arange(self.group.order), np.arange(self.size), indexing="ij")
        P[g, self.permutations, x] = 1.0
        return P

    @cached_property
    def representation(self) -> Representation:
        """C(X, R) decomposed into irreps; its change of basis is the Fourier transform."""
        return Representation.from_matrices(
            self.group, self.permutation_matrices, name=f"C({self.group.name}/H{len(self.subgroup)})"
        )

    @property
    def multiplicities(self) -> dict[str, int]:
        """Irrep name -> multiplicity in C(X, R) (the seed's Tables 2 and 3)."""
        return self.representation.multiplicities

    @property
    def fourier_basis(self) -> np.ndarray:
        """``[size, size]`` orthogonal ``Q``: columns grouped by irrep copy.

        ``Q.T @ f`` is the Fourier transform of a function ``f`` on X (irrep components);
        ``Q @ c`` its inverse. ``P(g) Q = Q blockdiag(rho(g))``.
        """
        return self.representation.change_of_basis
