"""Finite groups of orthogonal matrices.

A :class:`FiniteGroup` is a finite set of ``d x d`` orthogonal matrices (``d = 2`` for the
planar groups, ``3`` for the Platonic rotation groups) closed under multiplication. All
combinatorial structure (Cayley table, inverses, conjugacy classes, subgroups) is derived
once from the matrices in numpy float64 and cached on the instance.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from eqvit.utils import check_memory

if TYPE_CHECKING:
    from eqvit.groups.homogeneous import HomogeneousSpace
    from eqvit.groups.irreps import Irrep, Representation

# Products of group elements are matched to elements within this tolerance.
MATCH_ATOL = 1e-8


def match_matrices(queries: np.ndarray, elements: np.ndarray, atol: float = MATCH_ATOL) -> np.ndarray:
    """Index of the element equal to each query matrix.

    Args:
        queries: ``[..., d, d]`` matrices.
        elements: ``[n, d, d]`` distinct matrices.

    Returns:
        int64 ``[...]`` indices into ``elements``. Raises ValueError if a query matches none.
    """
    shape = queries.shape[:-2]
    flat_q = queries.reshape(-1, queries.shape[-2] * queries.shape[-1])
    flat_e = elements.reshape(len(elements), -1)
    # Max-abs distance between every query and every element, in chunks to bound memory.
    out = np.empty(len(flat_q), dtype=np.int64)
    chunk = max(1, 2**22 // max(1, flat_e.size))
    for start in range(0, len(flat_q), chunk):
        dist = np.abs(flat_q[start : start + chunk, None, :] - flat_e[None]).max(-1)
        idx = dist.argmin(-1)
        best = dist[np.arange(len(idx)), idx]
        if np.any(best > atol):
            raise ValueError(
                f"matrix is not a group element: nearest element is {best.max():.3e} away (tolerance {atol})"
            )
        out[start : start + chunk] = idx
    return out.reshape(shape)


def close_under_multiplication(generators: Sequence[np.ndarray], max_order: int = 10_000) -> np.ndarray:
    """All products of ``generators``, identity first, in breadth-first order.

    Returns ``[n, d, d]`` float64. The order is deterministic: breadth-first over words in the
    generators, so index 0 is the identity and indices 1.. are the generators (deduplicated).
    """
    gens = [np.asarray(g, dtype=np.float64) for g in generators]
    d = gens[0].shape[0]
    elements = [np.eye(d)]
    frontier = [np.eye(d)]
    while frontier:
        new_frontier = []
        for x in frontier:
            for g in gens:
                y = g @ x
                if not any(np.abs(y - e).max() < MATCH_ATOL for e in elements):
                    elements.append(y)
                    new_frontier.append(y)
                    if len(elements) > max_order:
                        raise ValueError(f"generators produce more than {max_order} elements")
        frontier = new_frontier
    return np.stack(elements)


class FiniteGroup:
    """A finite group of orthogonal ``d x d`` matrices.

    Args:
        name: short name, e.g. ``"D4"`` or ``"I"``.
        elements: ``[order, d, d]`` orthogonal matrices, ``elements[0]`` the identity.
        irrep_builder: callable ``group -> list[Irrep]``; defaults to a numerical decomposition
            of the regular representation (:func:`eqvit.groups.irreps.decompose_regular`).
        parent: for a subgroup, the group it was taken from, with ``parent_indices``.
    """

    def __init__(
        self,
        name: str,
        elements: np.ndarray,
        irrep_builder: Callable[[FiniteGroup], list[Irrep]] | None = None,
        parent: FiniteGroup | None = None,
        parent_indices: np.ndarray | None = None,
    ) -> None:
        elements = np.asarray(elements, dtype=np.float64)
        if elements.ndim != 3 or elements.shape[1] != elements.shape[2]:
            raise ValueError(f"expected elements of shape [order, d, d], got {list(elements.shape)}")
        d = elements.shape[1]
        if np.abs(elements[0] - np.eye(d)).max() > MATCH_ATOL:
            raise ValueError("elements[0] must be the identity")
        gram = np.einsum("gji,gjk->gik", elements, elements)
        if np.abs(gram - np.eye(d)).max() > 1e-10:
            raise ValueError("group elements must be orthogonal matrices")
        self.name = name
        self.elements = elements
        self.elements.setflags(write=False)
        self._irrep_builder = irrep_builder
        self.parent = parent
        self.parent_indices = None if parent_indices is None else np.asarray(parent_indices, dtype=np.int64)

    # ------------------------------------------------------------------ structure
    @property
    def order(self) -> int:
        return len(self.elements)

    @property
    def dim(self) -> int:
        """Dimension ``d`` of the space the matrices act on (2 or 3)."""
        return self.elements.shape[1]

    def __len__(self) -> int:
        return self.order

    def __deepcopy__(self, memo: dict) -> FiniteGroup:
        # A group is an immutable value (and cached): copies of a model share it, so feature types
        # and ``model.group`` keep comparing by identity.
        return self

    def __repr__(self) -> str:
        return f"FiniteGroup({self.name!r}, order={self.order}, d={self.dim})"

    def __reduce_ex__(self, protocol: int):
        # A group that ``get_group`` serves is pickled by name, so an unpickled model shares the cached
        # object (feature types compare groups by identity); any other group by value.
        if self._is_served_by_name():
            from eqvit.groups import get_group

            return get_group, (self.name,)
        return super().__reduce_ex__(protocol)

    def __getstate__(self) -> dict:
        # the irreps travel as values: an irrep builder may be a lambda or a local function, which pickle
        # cannot store
        state = dict(self.__dict__)
        state["irreps"] = self.irreps
        state["_irrep_builder"] = None
        return state

    def _is_served_by_name(self) -> bool:
        """True when the built-in ``get_group(self.name)`` is this very object (checked without building a
        group of another order; groups registered by users travel by value, their factory may be absent)."""
        from eqvit.groups import get_group

        match = re.fullmatch(r"([CD])([1-9]\d*)", self.name)
        if match is not None:
            if int(match.group(2)) * (1 if match.group(1) == "C" else 2) != self.order:
                return False
        elif self.name not in ("T", "O", "I"):
            return False
        return get_group(self.name) is self

    @cached_property
    def cayley(self) -> np.ndarray:
        """int64 ``[order, order]`` with ``elements[cayley[i, j]] == elements[i] @ elements[j]``."""
        entry = 2 * 8 * (self.dim**2 + 1)  # every product matrix and its index, and their matching
        what = f"the Cayley table of {self.name} (order {self.order:,})"
        check_memory(what, entry * self.order**2, f"order^2 entries of {entry} bytes")
        products = np.einsum("iab,jbc->ijac", self.elements, self.elements)
        table = match_matrices(products, self.elements)
        table.setflags(write=False)
        return table

    @cached_property
    def inverse(self) -> np.ndarray:
        """int64 ``[order]``: ``cayley[i, inverse[i]] == 0``."""
        inv = np.argmax(self.cayley == 0, axis=1)
        inv.setflags(write=False)
        return inv

    def multiply(self, a: int | np.ndarray, b: int | np.ndarray) -> np.ndarray:
        return self.cayley[a, b]

    def index_of(self, matrix: np.ndarray) -> int | np.ndarray:
        """Index of the element equal to ``matrix [d, d]`` (or ``[..., d, d]``)."""
        idx = match_matrices(np.asarray(matrix, dtype=np.float64), self.elements)
        return int(idx) if idx.ndim == 0 else idx

    @cached_property
    def element_orders(self) -> np.ndarray:
        """int64 ``[order]``: the order of each element (the identity has order 1)."""
        orders = np.zeros(self.order, dtype=np.int64)
        power = np.arange(self.order)  # g^k, starting at k = 1
        for k in range(1, self.order + 1):
            orders[(orders == 0) & (power == 0)] = k
            if orders.all():
                break
            power = self.cayley[power, np.arange(self.order)]
        return orders

    @cached_property
    def conjugacy_classes(self) -> list[np.ndarray]:
        """Conjugacy classes as sorted index arrays; the first is ``[0]``."""
        class_of = np.full(self.order, -1)
        classes: list[np.ndarray] = []
        for g in range(self.order):
            if class_of[g] >= 0:
                continue
            # h g h^-1 for every h
            members = np.unique(self.cayley[self.cayley[:, g], self.inverse])
            class_of[members] = len(classes)
            classes.append(members)
        return classes

    @cached_property
    def class_index(self) -> np.ndarray:
        """int64 ``[order]``: the conjugacy class of each element."""
        idx = np.empty(self.order, dtype=np.int64)
        for k, members in enumerate(self.conjugacy_classes):
            idx[members] = k
        return idx

    # ------------------------------------------------------------------ subgroups
    def closure(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Sorted indices of the subgroup generated by ``indices``."""
        gens = np.unique(np.asarray(indices, dtype=np.int64))
        member = np.zeros(self.order, dtype=bool)
        member[0] = True
        member[gens] = True
        while True:
            current = np.flatnonzero(member)
            products = self.cayley[np.ix_(current, gens)] if len(gens) else current
            grown = member.copy()
            grown[products.ravel()] = True
            if grown.sum() == member.sum():
                return current
            member = grown

    def conjugate_subgroup(self, subgroup: np.ndarray, g: int) -> np.ndarray:
        """Sorted indices of ``g H g^-1``."""
        return np.unique(self.cayley[self.cayley[g, subgroup], self.inverse[g]])

    def _conjugates(self, subgroup: np.ndarray) -> list[np.ndarray]:
        """The distinct conjugates of ``subgroup``, lexicographically sorted."""
        seen: dict[bytes, np.ndarray] = {}
        for g in range(self.order):
            conj = self.conjugate_subgroup(subgroup, g)
            seen.setdefault(conj.tobytes(), conj)
        return sorted(seen.values(), key=lambda s: s.tolist())

    @cached_property
    def _subgroup_classes(self) -> list[np.ndarray]:
        # Breadth-first over conjugacy classes: extending one representative H of each class by
        # every g reaches a conjugate of every subgroup, since <aHa^-1, aga^-1> = a<H, g>a^-1.
        class_of: dict[bytes, int] = {}
        representatives: list[np.ndarray] = []

        def add(sub: np.ndarray) -> bool:
            if sub.tobytes() in class_of:
                return False
            conjugates = self._conjugates(sub)
            for conj in conjugates:
                class_of[conj.tobytes()] = len(representatives)
            representatives.append(conjugates[0])
            return True

        add(np.array([0], dtype=np.int64))
        frontier = [representatives[0]]
        while frontier:
            next_frontier = []
            for sub in frontier:
                inside = np.zeros(self.order, dtype=bool)
                inside[sub] = True
                for g in np.flatnonzero(~inside):
                    if add(self.closure(np.append(sub, g))):
                        next_frontier.append(representatives[-1])
            frontier = next_frontier
        return sorted(representatives, key=lambda s: (len(s), s.tolist()))

    def all_subgroups(self) -> list[np.ndarray]:
        """Every subgroup, as sorted index arrays ordered by size."""
        every = [conj for rep in self._subgroup_classes for conj in self._conjugates(rep)]
        return sorted(every, key=lambda s: (len(s), s.tolist()))

    def subgroups(self) -> list[np.ndarray]:
        """One subgroup per conjugacy class of subgroups (sorted index arrays), by size.

        The representative of each class is the first of its members in the order
        (size, lexicographic indices).
        """
        return list(self._subgroup_classes)

    def subgroup(self, indices: Sequence[int] | np.ndarray, name: str | None = None) -> FiniteGroup:
        """The subgroup on ``indices`` as a :class:`FiniteGroup` of its own.

        Its elements are ``self.elements[parent_indices]`` with the identity first; planar
        subgroups get the closed-form irreps of :mod:`eqvit.groups.planar` with the seed's names.
        """
        from eqvit.groups.planar import identify_planar_subgroup

        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or len(idx) == 0:
            raise ValueError(f"expected a 1-D array of element indices, got shape {list(idx.shape)}")
        if np.any((idx < 0) | (idx >= self.order)):
            raise ValueError(f"element indices must lie in [0, {self.order}), got {idx.tolist()}")
        if not np.array_equal(self.closure(idx), np.unique(idx)):
            raise ValueError(f"indices {sorted(idx.tolist())} are not closed under multiplication")
        ordered = np.concatenate([[0], np.sort(idx[idx != 0])])
        if self.dim == 2:
            group = identify_planar_subgroup(self.elements[ordered])
            if group is not None:
                sub_name, elements, order_in_sub = group
                return FiniteGroup(
                    name or sub_name,
                    elements,
                    irrep_builder=_planar_builder_for(sub_name),
                    parent=self,
                    parent_indices=ordered[order_in_sub],
                )
        return FiniteGroup(
            name or f"{self.name}>H{len(ordered)}", self.elements[ordered], parent=self, parent_indices=ordered
        )

    # ------------------------------------------------------------------ representations
    @cached_property
    def irreps(self) -> list[Irrep]:
        """The real irreducible representations, trivial first."""
        from eqvit.groups.irreps import decompose_regular

        builder = self._irrep_builder or decompose_regular
        return builder(self)

    def irrep(self, name: str) -> Irrep:
        """The irrep called ``name``; ValueError listing the valid names otherwise."""
        for rho in self.irreps:
            if rho.name == name:
                return rho
        from eqvit.utils import unknown_name_error

        raise unknown_name_error(f"irrep of {self.name}", name, [rho.name for rho in self.irreps])

    @cached_property
    def character_table(self) -> np.ndarray:
        """float64 ``[num_irreps, order]``: ``chi_rho(g)``."""
        return np.stack([rho.character for rho in self.irreps])

    def homogeneous_space(self, subgroup: Sequence[int] | np.ndarray | FiniteGroup) -> HomogeneousSpace:
        """The homogeneous space ``G/H`` for a subgroup ``H`` (indices or a subgroup FiniteGroup)."""
        from eqvit.groups.homogeneous import HomogeneousSpace

        if isinstance(subgroup, FiniteGroup):
            if subgroup.parent is not self:
                raise ValueError(f"{subgroup!r} is not a subgroup taken from {self!r}")
            subgroup = subgroup.parent_indices
        return HomogeneousSpace(self, np.asarray(subgroup, dtype=np.int64))

    @cached_property
    def regular_representation(self) -> Representation:
        """The regular representation, with its orthogonal change of basis to irreps."""
        return self.homogeneous_space([0]).representation

    @cached_property
    def generators(self) -> np.ndarray:
        """A small generating set, chosen greedily in index order."""
        gens: list[int] = []
        span = np.array([0])
        for g in range(1, self.order):
            if g not in span:
                gens.append(g)
                span = self.closure(gens)
                if len(span) == self.order:
                    break
        return np.array(gens, dtype=np.int64)


def _planar_builder_for(name: str) -> Callable[[FiniteGroup], list[Irrep]]:
    from eqvit.groups.planar import planar_irreps

    return lambda group: planar_irreps(name, group.elements)


def describe_element(matrix: np.ndarray) -> str:
    """Short label of an orthogonal matrix: rotation angle / axis, reflection (2-D) or minus a rotation (3-D)."""
    d = matrix.shape[0]
    det = np.linalg.det(matrix)
    if d == 2:
        if det > 0:
            return f"rot {np.degrees(np.arctan2(matrix[1, 0], matrix[0, 0])) % 360:.1f}deg"
        axis = np.degrees(np.arctan2(matrix[1, 0], matrix[0, 0]) / 2) % 180
        return f"reflect axis {axis:.1f}deg"
    if det < 0:  # improper: minus a rotation
        rotation = describe_element(-matrix)
        return "inversion" if rotation == "identity" else f"-{rotation}"
    angle = np.degrees(np.arccos(np.clip((np.trace(matrix) - 1) / 2, -1, 1)))
    if angle < 1e-6:
        return "identity"
    axis = np.array([matrix[2, 1] - matrix[1, 2], matrix[0, 2] - matrix[2, 0], matrix[1, 0] - matrix[0, 1]])
    if np.linalg.norm(axis) < 1e-6:  # half-turn: axis from the symmetric part
        w, v = np.linalg.eigh((matrix + matrix.T) / 2)
        axis = v[:, np.argmax(w)]
    axis = axis / np.linalg.norm(axis)
    return f"rot {angle:.1f}deg [{axis[0]:+.2f},{axis[1]:+.2f},{axis[2]:+.2f}]"
