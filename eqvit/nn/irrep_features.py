"""Feature spaces V = (+)_rho R^{C_rho} (x) V_rho stored irrep-wise (O(2) seed, eq. 2).

A token feature is one flat vector of length ``dim = sum_rho C_rho d_rho``: the irreps in the
group's order, and inside irrep rho its ``C_rho`` copies one after another, each copy holding
its ``d_rho`` components (so the rho block is a row-major ``[C_rho, d_rho]`` array). Group
element g acts by ``blockdiag_rho(I_{C_rho} (x) rho(g))`` (:meth:`FeatureType.representation`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import torch

from eqvit.groups import FiniteGroup, Irrep


class FeatureType:
    """The G-representation ``(+)_rho R^{C_rho} (x) V_rho`` with irrep-wise storage.

    Args:
        group: the finite group G.
        multiplicities: ``{irrep name: C_rho}`` (missing names count 0) or one count per irrep
            in ``group.irreps`` order.
    """

    def __init__(self, group: FiniteGroup, multiplicities: Mapping[str, int] | Sequence[int]) -> None:
        names = [rho.name for rho in group.irreps]
        if isinstance(multiplicities, Mapping):
            unknown = [k for k in multiplicities if k not in names]
            if unknown:
                raise ValueError(f"unknown irreps {unknown} of {group.name}; valid: {', '.join(names)}")
            counts = [int(multiplicities.get(n, 0)) for n in names]
        else:
            counts = [int(c) for c in multiplicities]
            if len(counts) != len(names):
                raise ValueError(f"expected {len(names)} multiplicities for {group.name} ({names}), got {len(counts)}")
        if any(c < 0 for c in counts):
            raise ValueError(f"multiplicities must be non-negative, got {counts}")
        self.group = group
        self.irreps: list[Irrep] = list(group.irreps)
        self.multiplicities: list[int] = counts
        offsets = np.cumsum([0] + [c * rho.dim for c, rho in zip(counts, self.irreps)])
        self.offsets = offsets
        self.dim = int(offsets[-1])

    # ------------------------------------------------------------------ constructors
    @classmethod
    def regular(cls, group: FiniteGroup, copies: int = 1) -> FeatureType:
        """``copies`` copies of the regular representation: ``C_rho = copies * d_rho / type_factor``."""
        return cls(group, [copies * rho.dim // rho.type_factor for rho in group.irreps])

    def __repr__(self) -> str:
        parts = ", ".join(f"{rho.name}x{c}" for rho, c in zip(self.irreps, self.multiplicities) if c)
        return f"FeatureType({self.group.name}: {parts}; dim={self.dim})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FeatureType) and other.group is self.group and other.multiplicities == self.multiplicities
        )

    def __hash__(self) -> int:
        return hash((id(self.group), tuple(self.multiplicities)))

    def __mul__(self, n: int) -> FeatureType:
        return FeatureType(self.group, [c * n for c in self.multiplicities])

    __rmul__ = __mul__

    def __add__(self, other: FeatureType) -> FeatureType:
        if other.group is not self.group:
            raise ValueError(f"cannot add feature types of {self.group.name} and {other.group.name}")
        return FeatureType(self.group, [a + b for a, b in zip(self.multiplicities, other.multiplicities)])

    # ------------------------------------------------------------------ layout
    def blocks(self) -> list[tuple[int, Irrep, int, slice]]:
        """``(irrep index, irrep, C_rho, slice of the flat vector)`` for every irrep with C_rho > 0."""
        return [
            (i, rho, c, slice(int(self.offsets[i]), int(self.offsets[i + 1])))
            for i, (rho, c) in enumerate(zip(self.irreps, self.multiplicities))
            if c
        ]

    @cached_property
    def copies(self) -> list[tuple[int, int, np.ndarray]]:
        """``(irrep index, copy index, coordinate indices [d_rho])`` for every irrep copy, in storage order."""
        out = []
        for i, rho, c, sl in self.blocks():
            for k in range(c):
                start = sl.start + k * rho.dim
                out.append((i, k, np.arange(start, start + rho.dim)))
        return out

    @cached_property
    def copy_index(self) -> np.ndarray:
        """int64 ``[dim]``: which copy (position in :attr:`copies`) each coordinate belongs to."""
        out = np.empty(self.dim, dtype=np.int64)
        for n, (_, _, idx) in enumerate(self.copies):
            out[idx] = n
        return out

    @cached_property
    def trivial_index(self) -> np.ndarray:
        """int64 coordinates of the trivial-irrep copies."""
        idx = [coords for i, _, coords in self.copies if self.irreps[i].is_trivial]
        return np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x [..., dim]`` -> one ``[..., C_rho, d_rho]`` tensor per irrep with C_rho > 0."""
        return [x[..., sl].unflatten(-1, (c, rho.dim)) for _, rho, c, sl in self.blocks()]

    def join(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Inverse of :meth:`split`."""
        return torch.cat([p.flatten(-2) for p in parts], dim=-1)

    # ------------------------------------------------------------------ the representation
    @cached_property
    def representation(self) -> np.ndarray:
        """float64 ``[order, dim, dim]``: ``blockdiag_rho(I_{C_rho} (x) rho(g))``."""
        out = np.zeros((self.group.order, self.dim, self.dim))
        for _i, rho, c, sl in self.blocks():
            out[:, sl, sl] = np.einsum("ab,gde->gadbe", np.eye(c), rho.matrices).reshape(
                self.group.order, c * rho.dim, c * rho.dim
            )
        out.setflags(write=False)
        return out

    def act(self, g: int, x: torch.Tensor) -> torch.Tensor:
        """Group element ``g`` (an index) applied to features ``x [..., dim]``."""
        return x @ torch.tensor(self.representation[g], dtype=x.dtype, device=x.device).T
