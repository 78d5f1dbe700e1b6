"""Real irreducible representations and their direct sums.

An :class:`Irrep` is a real orthogonal representation that is irreducible over the reals; its
*type* (real, complex or quaternionic) is the dimension of its endomorphism algebra, read off
the character norm <chi, chi> = 1, 2, 4. A :class:`Representation` is a direct sum of irreps
followed by an orthogonal change of basis, as in escnn.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from eqvit.groups.base import FiniteGroup

TYPE_FACTOR = {"real": 1, "complex": 2, "quaternionic": 4}
_TYPE_OF_NORM = {1: "real", 2: "complex", 4: "quaternionic"}


class Irrep:
    """A real irreducible representation of a finite group.

    Args:
        name: the seed's label (``"A1"``, ``"E2"``, ``"T1"``, ...).
        matrices: ``[order, dim, dim]`` orthogonal matrices, ``matrices[g]`` = rho(g).
        type: ``"real"``, ``"complex"`` or ``"quaternionic"``; inferred from the character if None.
    """

    def __init__(self, name: str, matrices: np.ndarray, type: str | None = None) -> None:
        matrices = np.asarray(matrices, dtype=np.float64)
        if matrices.ndim != 3 or matrices.shape[1] != matrices.shape[2]:
            raise ValueError(f"expected irrep matrices of shape [order, dim, dim], got {list(matrices.shape)}")
        self.name = name
        self.matrices = matrices
        self.matrices.setflags(write=False)
        self.character = np.trace(matrices, axis1=1, axis2=2)
        norm = int(round(float(self.character @ self.character) / len(matrices)))
        inferred = _TYPE_OF_NORM.get(norm)
        if inferred is None or (norm > 1 and not _is_division_algebra(commutant_basis(matrices))):
            raise ValueError(
                f"irrep {name!r} is reducible: <chi, chi> = {norm} and its commutant is not a division algebra"
            )
        if type is not None and type != inferred:
            raise ValueError(f"irrep {name!r} declared {type!r} but its character says {inferred!r}")
        self.type = inferred

    @property
    def dim(self) -> int:
        return self.matrices.shape[1]

    @property
    def type_factor(self) -> int:
        """dim End_G(V): 1 (real), 2 (complex) or 4 (quaternionic)."""
        return TYPE_FACTOR[self.type]

    @property
    def is_trivial(self) -> bool:
        return self.dim == 1 and bool(np.all(np.abs(self.matrices - 1.0) < 1e-12))

    def __call__(self, g: int | np.ndarray) -> np.ndarray:
        return self.matrices[g]

    def __repr__(self) -> str:
        return f"Irrep({self.name!r}, dim={self.dim}, type={self.type!r})"

    @cached_property
    def endomorphism_basis(self) -> np.ndarray:
        """``[type_factor, dim, dim]`` orthonormal basis of the matrices commuting with rho.

        For real type it is the identity; for complex type the identity and a complex
        structure J (J^2 = -1); computed from the group average, so it fits any basis.
        """
        return commutant_basis(self.matrices)


def commutant_basis(matrices: np.ndarray, atol: float = 1e-9) -> np.ndarray:
    """Orthonormal basis (Frobenius inner product) of ``{M : M rho(g) = rho(g) M}``.

    Args:
        matrices: ``[order, n, n]`` orthogonal representation matrices.

    Returns:
        ``[k, n, n]`` with the identity direction first.
    """
    n = matrices.shape[1]
    # Averaging E -> (1/|G|) sum_g rho(g) E rho(g)^T is the orthogonal projection onto the commutant.
    eye_basis = np.eye(n * n).reshape(n * n, n, n)
    averaged = np.einsum("gab,kbc,gdc->kad", matrices, eye_basis, matrices) / len(matrices)
    flat = averaged.reshape(n * n, n * n)
    u, s, _ = np.linalg.svd(flat.T, full_matrices=False)
    basis = u[:, s > atol].T.reshape(-1, n, n)
    # Put the identity first and orthonormalize the rest against it.
    first = np.eye(n) / np.sqrt(n)
    rest = [b - np.sum(b * first) * first for b in basis]
    out = [first]
    for b in rest:
        for o in out:
            b = b - np.sum(b * o) * o
        norm = np.linalg.norm(b)
        if norm > atol:
            out.append(b / norm)
    return np.stack(out)


def _is_division_algebra(basis: np.ndarray) -> bool:
    """True if the commutant (identity first) is R, C or H: its other elements are antisymmetric.

    <chi, chi> alone cannot tell a quaternionic irrep from, say, two copies of the trivial one
    (both give 4); their commutants (H versus M_2(R)) differ in exactly this way.
    """
    return all(np.abs(b + b.T).max() < 1e-8 for b in basis[1:])


def multiplicity(character: np.ndarray, irrep: Irrep) -> int:
    """How often ``irrep`` occurs in a representation with the given character ``[order]``."""
    ratio = float(character @ irrep.character) / float(irrep.character @ irrep.character)
    count = int(round(ratio))
    if abs(ratio - count) > 1e-6:
        raise ValueError(f"character is not a combination of irreps (got multiplicity {ratio:.6f})")
    return count


def intertwiners(
    matrices: np.ndarray, irrep: Irrep, count: int, rng: np.random.Generator, atol: float = 1e-9
) -> list[np.ndarray]:
    """``count`` mutually orthogonal isometric intertwiners ``X [D, dim]`` with rho(g) X = X sigma(g).

    Built by group-averaging random matrices (which projects onto the intertwiner space), then
    a block Gram-Schmidt: for an intertwiner X, X^T X commutes with sigma and is symmetric, so
    it is a multiple of the identity for irreps of any type.
    """
    found: list[np.ndarray] = []
    D, d = matrices.shape[1], irrep.dim
    for _ in range(8 * count * irrep.type_factor + 8):
        if len(found) == count:
            break
        E = rng.standard_normal((D, d))
        X = np.einsum("gab,bc,gdc->ad", matrices, E, irrep.matrices) / len(matrices)
        for B in found:
            X = X - B @ (B.T @ X)
        scale = np.trace(X.T @ X) / d
        if scale > atol:
            found.append(X / np.sqrt(scale))
    if len(found) != count:
        raise RuntimeError(f"found {len(found)} of {count} copies of irrep {irrep.name!r}")
    return found


class Representation:
    """A direct sum of irreps followed by an orthogonal change of basis.

    ``matrices[g] = Q @ blockdiag(irreps[0](g), irreps[1](g), ...) @ Q.T`` with ``Q`` the
    ``change_of_basis`` (identity when None).

    Args:
        group: the FiniteGroup represented.
        irreps: the summands in order (repeats allowed).
        change_of_basis: ``[dim, dim]`` orthogonal matrix ``Q``.
        name: optional label.
    """

    def __init__(
        self,
        group: FiniteGroup,
        irreps: Sequence[Irrep],
        change_of_basis: np.ndarray | None = None,
        name: str | None = None,
    ) -> None:
        self.group = group
        self.irreps = list(irreps)
        self.dim = sum(rho.dim for rho in self.irreps)
        if change_of_basis is None:
            change_of_basis = np.eye(self.dim)
        change_of_basis = np.asarray(change_of_basis, dtype=np.float64)
        if change_of_basis.shape != (self.dim, self.dim):
            raise ValueError(
                f"expected change of basis of shape [{self.dim}, {self.dim}], got {list(change_of_basis.shape)}"
            )
        if np.abs(change_of_basis.T @ change_of_basis - np.eye(self.dim)).max() > 1e-8:
            raise ValueError("change of basis must be orthogonal")
        self.change_of_basis = change_of_basis
        self.name = name or "+".join(rho.name for rho in self.irreps)

    @classmethod
    def from_matrices(
        cls, group: FiniteGroup, matrices: np.ndarray, name: str | None = None, seed: int = 0
    ) -> Representation:
        """Decompose orthogonal representation ``matrices [order, D, D]`` into ``group``'s irreps."""
        matrices = np.asarray(matrices, dtype=np.float64)
        if matrices.ndim != 3 or len(matrices) != group.order or matrices.shape[1] != matrices.shape[2]:
            raise ValueError(
                f"expected matrices of shape [{group.order}, D, D] for {group.name}, got {list(matrices.shape)}"
            )
        character = np.trace(matrices, axis1=1, axis2=2)
        rng = np.random.default_rng(seed)
        irreps: list[Irrep] = []
        columns: list[np.ndarray] = []
        for rho in group.irreps:
            count = multiplicity(character, rho)
            for X in intertwiners(matrices, rho, count, rng) if count else []:
                irreps.append(rho)
                columns.append(X)
        basis = np.concatenate(columns, axis=1) if columns else np.zeros((matrices.shape[1], 0))
        if basis.shape[1] != matrices.shape[1]:
            raise ValueError(f"matrices of dim {matrices.shape[1]} decomposed into only {basis.shape[1]} dims")
        return cls(group, irreps, basis, name=name)

    @cached_property
    def matrices(self) -> np.ndarray:
        """``[order, dim, dim]`` representation matrices."""
        Q = self.change_of_basis
        block = self.block_diagonal
        return np.einsum("ab,gbc,dc->gad", Q, block, Q)

    @cached_property
    def block_diagonal(self) -> np.ndarray:
        """``[order, dim, dim]`` direct sum of the irreps, before the change of basis."""
        out = np.zeros((self.group.order, self.dim, self.dim))
        start = 0
        for rho in self.irreps:
            out[:, start : start + rho.dim, start : start + rho.dim] = rho.matrices
            start += rho.dim
        return out

    @property
    def character(self) -> np.ndarray:
        """``[order]`` traces, independent of the change of basis."""
        return sum(rho.character for rho in self.irreps)

    @property
    def multiplicities(self) -> dict[str, int]:
        """Irrep name -> number of copies, in the group's irrep order (zeros included)."""
        counts = {rho.name: 0 for rho in self.group.irreps}
        for rho in self.irreps:
            counts[rho.name] += 1
        return counts

    def __call__(self, g: int | np.ndarray) -> np.ndarray:
        return self.matrices[g]

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}x{n}" for k, n in self.multiplicities.items() if n)
        return f"Representation({self.group.name}: {parts}; dim={self.dim})"

    def __add__(self, other: Representation) -> Representation:
        return self.direct_sum(other)

    def direct_sum(self, other: Representation) -> Representation:
        if other.group is not self.group:
            raise ValueError(f"cannot add representations of {self.group.name} and {other.group.name}")
        Q = np.zeros((self.dim + other.dim, self.dim + other.dim))
        Q[: self.dim, : self.dim] = self.change_of_basis
        Q[self.dim :, self.dim :] = other.change_of_basis
        return Representation(self.group, self.irreps + other.irreps, Q)

    def change_basis(self, Q: np.ndarray) -> Representation:
        """The same representation expressed in the basis ``x -> Q x``."""
        return Representation(self.group, self.irreps, np.asarray(Q) @ self.change_of_basis)

    def restrict(self, subgroup: FiniteGroup) -> Representation:
        """Restriction to ``subgroup`` (taken with ``group.subgroup(...)``), decomposed into its irreps.

        The change of basis is the isometry of the O(2) seed's Theorem 2, and
        ``.multiplicities`` are the D_sigma there.
        """
        if subgroup.parent is not self.group or subgroup.parent_indices is None:
            raise ValueError(f"expected a subgroup made with {self.group.name}.subgroup(...), got {subgroup!r}")
        return Representation.from_matrices(subgroup, self.matrices[subgroup.parent_indices])


def _cluster(values: np.ndarray, tol: float) -> list[np.ndarray]:
    """Group indices of sorted ``values`` into runs whose neighbours differ by less than tol."""
    breaks = np.flatnonzero(np.diff(values) > tol) + 1
    return np.split(np.arange(len(values)), breaks)


def _canonical_basis(B: np.ndarray) -> np.ndarray:
    """An orthonormal basis of span(B) that depends only on the subspace, not on B.

    Gram-Schmidt on the projections of the standard basis vectors; keeps irrep matrices
    reproducible across BLAS builds, whose eigenvectors may differ by rotations.
    """
    P = B @ B.T
    out: list[np.ndarray] = []
    for j in range(P.shape[0]):
        v = P[:, j].copy()
        for o in out:
            v -= (o @ v) * o
        norm = np.linalg.norm(v)
        if norm > 1e-6:
            out.append(v / norm)
            if len(out) == B.shape[1]:
                break
    return np.stack(out, axis=1)


def decompose_regular(group: FiniteGroup, seed: int = 0) -> list[Irrep]:
    """All real irreps of ``group`` from its regular representation (generic names ``rho0``...).

    1. A random symmetric element of the group algebra's centre has the isotypic components of
       the left regular representation as eigenspaces (complex-conjugate pairs merge, giving the
       real irreps).
    2. Inside one component, a random symmetric element of the right regular algebra (the
       commutant of the left action) splits off one irreducible subspace as an eigenspace.
    Both use a fixed-seed PCG64 stream, so the result is deterministic.
    """
    n, C, inv = group.order, group.cayley, group.inverse
    rng = np.random.default_rng(seed)
    rows = np.arange(n)
    left = np.zeros((n, n, n))
    right = np.zeros((n, n, n))
    for g in range(n):
        left[g, C[g, rows], rows] = 1.0  # e_h -> e_{gh}
        right[g, C[rows, inv[g]], rows] = 1.0  # e_h -> e_{h g^-1}
    class_coeff = rng.standard_normal(len(group.conjugacy_classes))[group.class_index]
    central = np.einsum("g,gab->ab", class_coeff, left)
    central = central + central.T
    evals, evecs = np.linalg.eigh(central)
    tol = 1e-7 * max(1.0, np.abs(evals).max())
    irreps: list[Irrep] = []
    for cluster in _cluster(evals, tol):
        U = evecs[:, cluster]
        commutant = np.einsum("g,gab->ab", rng.standard_normal(n), right)
        commutant = U.T @ (commutant + commutant.T) @ U
        w, V = np.linalg.eigh(commutant)
        first = _cluster(w, 1e-7 * max(1.0, np.abs(w).max()))[0]
        B = _canonical_basis(U @ V[:, first])
        irreps.append(Irrep(f"rho{len(irreps)}", np.einsum("ai,gab,bj->gij", B, left, B)))
    # Deterministic order: trivial first, then by dimension, then by character values.
    irreps.sort(key=lambda rho: (not rho.is_trivial, rho.dim, tuple(-np.round(rho.character, 6))))
    for k, rho in enumerate(irreps):
        rho.name = "A" if rho.is_trivial else f"rho{k}"
    return irreps
