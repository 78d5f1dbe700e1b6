"""Learnable G-invariant absolute positional encoding (O(2) seed, Sec. 4.2.2, eq. 8).

``PosEnc(x) = x + p`` is equivariant iff ``rho(g) p_rho(g^-1 . a) = p_rho(a)`` for every irrep. A basis
of the invariant subspace of ``R^M (x) V_rho`` is precomputed; each channel of ``p_rho`` is a learned
combination of it (``eqvit.fuse`` fixes ``p``).

The basis is canonical (:func:`invariant_basis`): built from the orbits of the points and the fixed
spaces of their stabilisers by a hand-written Gram-Schmidt, so the learned coefficients mean the same
encoding under every numpy/LAPACK build. State dicts written before it (no ``basis_version``) hold
coefficients in the eigenbasis of :func:`legacy_invariant_basis`; :class:`InvariantAPE` converts them
on load.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from eqvit.geometry.points import permutations_for
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.posenc.base import PositionalScheme

# What the coefficients ``pos_embed`` are coordinates in: 1 (a state dict without ``basis_version``) the
# eigh basis of legacy_invariant_basis, 2 the canonical invariant_basis.
BASIS_VERSION = 2


def _check_action(perms: np.ndarray, matrices: np.ndarray) -> None:
    """ValueError unless ``perms [order, M]`` holds permutations and ``matrices`` is ``[order, d, d]``."""
    if perms.ndim != 2 or not np.issubdtype(perms.dtype, np.integer):
        raise ValueError(f"expected integer permutations of shape [order, M], got {perms.dtype} {list(perms.shape)}")
    if matrices.ndim != 3 or matrices.shape[0] != perms.shape[0] or matrices.shape[1] != matrices.shape[2]:
        raise ValueError(
            f"expected matrices of shape [{perms.shape[0]}, d, d] (one per permutation), got {list(matrices.shape)}"
        )
    if not np.array_equal(np.sort(perms, axis=1), np.broadcast_to(np.arange(perms.shape[1]), perms.shape)):
        raise ValueError(f"expected every row of perms to be a permutation of 0..{perms.shape[1] - 1}")


def gram_schmidt(
    vectors: np.ndarray, tol: float = 1e-9, project: Callable[[np.ndarray], np.ndarray] | None = None
) -> np.ndarray:
    """Orthonormal ``[k, d]`` from the rows of ``vectors [n, d]``, taken in order; rows whose residual norm
    is at most ``tol`` are skipped. Written out (no LAPACK), so it gives the same basis on every build.

    ``project`` (a function on ``[d]`` vectors, e.g. a projector) is applied again to each accepted
    vector: a residual just above ``tol`` carries the round-off of its row magnified by ``1 / residual``,
    and projecting again puts it back into the projector's image to round-off.
    """
    basis: list[np.ndarray] = []

    def orthogonalise(r: np.ndarray) -> np.ndarray:
        for _ in range(2):  # the second pass removes what round-off left of the first
            for b in basis:
                r = r - np.sum(b * r) * b
        return r

    for row in np.asarray(vectors, dtype=np.float64):
        r = orthogonalise(row)
        norm = np.sqrt(np.sum(r * r))
        if norm <= tol:
            continue
        r = r / norm
        if project is not None:
            r = orthogonalise(project(r))
            r = r / np.sqrt(np.sum(r * r))
        basis.append(r)
    return np.array(basis, dtype=np.float64).reshape(len(basis), np.shape(vectors)[1])


def fixed_space_basis(matrices: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Orthonormal basis ``[k, d]`` of ``{v : rho(h) v = v for all h}`` of ``matrices [|H|, d, d]`` (orthogonal).

    Gram-Schmidt on ``P_H e_1, ..., P_H e_d`` with the projector ``P_H = mean_h rho(h)``, in that order.
    """
    projector = matrices.mean(axis=0)
    return gram_schmidt(projector.T, tol, project=lambda v: np.einsum("ij,j->i", projector, v))


def point_orbits(perms: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(orbit, carriers)`` per orbit of the points under ``perms [order, M]``, by smallest point index.

    ``orbit``: its sorted point indices (``orbit[0]`` is the representative ``a0``); ``carriers[j]``: the
    first group element ``g`` with ``perms[g, a0] == orbit[j]``.
    """
    seen = np.zeros(perms.shape[1], dtype=bool)
    orbits = []
    for a0 in range(perms.shape[1]):
        if seen[a0]:
            continue
        orbit, carriers = np.unique(perms[:, a0], return_index=True)  # the first occurrence of each image
        seen[orbit] = True
        orbits.append((orbit, carriers))
    return orbits


def invariant_basis(perms: np.ndarray, matrices: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Canonical orthonormal basis ``[n, M, d]`` of ``{p in R^M (x) R^d : rho(g) p(g^-1 a) = p(a)}``.

    An invariant ``p`` is fixed on each orbit by its value at the representative ``a0``, which must lie in
    the fixed space of ``rho`` restricted to the stabiliser ``H`` of ``a0``; then ``p(g a0) = rho(g) p(a0)``
    (the same for every such ``g``, as ``p(a0)`` is ``H``-fixed). Each vector of
    :func:`fixed_space_basis` spread over its orbit and normalised is one basis vector; orbits by
    representative, then the fixed-space vectors in order. No eigen- or QR decomposition is involved, so
    the basis does not depend on the LAPACK build (unlike :func:`legacy_invariant_basis`).

    Args:
        perms: ``[order, M]`` with ``points[perms[g, a]] = g points[a]``.
        matrices: ``[order, d, d]`` the irrep (orthogonal).
        tol: residual norm below which a fixed-space candidate is dependent.
    """
    perms, matrices = np.asarray(perms), np.asarray(matrices, dtype=np.float64)
    _check_action(perms, matrices)
    M, d = perms.shape[1], matrices.shape[1]
    basis = []
    for orbit, carriers in point_orbits(perms):
        a0 = orbit[0]
        stabiliser = np.flatnonzero(perms[:, a0] == a0)
        for v in fixed_space_basis(matrices[stabiliser], tol):
            p = np.zeros((M, d))
            p[orbit] = np.einsum("gij,j->gi", matrices[carriers], v)
            basis.append(p / np.sqrt(np.sum(p * p)))
    return np.array(basis, dtype=np.float64).reshape(len(basis), M, d)


def legacy_invariant_basis(perms: np.ndarray, matrices: np.ndarray) -> np.ndarray:
    """The basis ``[n, M, d]`` of the same space that eqvit used before :data:`BASIS_VERSION` 2.

    The eigenvectors (eigenvalue 1) of the group-averaged projector by ``np.linalg.eigh``. The eigenspace
    is degenerate, so which basis comes out depends on the numpy/LAPACK build: kept only to read
    coefficients written against it (:meth:`InvariantAPE.upgrade_state_dict_`).
    """
    order, M = perms.shape
    d = matrices.shape[1]
    # Group average of (g . p)(perm[g, a]) = rho(g) p(a): a projector onto the invariants.
    proj = np.zeros((M, d, M, d))
    a = np.arange(M)
    for g in range(order):
        proj[perms[g][:, None], :, a[:, None], :] += matrices[g][None] / order
    proj = proj.reshape(M * d, M * d)
    proj = (proj + proj.T) / 2
    w, v = np.linalg.eigh(proj)
    basis = v[:, w > 0.5].T
    return basis.reshape(-1, M, d)


class InvariantAPE(PositionalScheme, ExactBuffers):
    """``x [B, M, V.dim] -> x + p`` with ``p`` G-invariant on the patch centres.

    ``pos_embed.{k}`` ``[C, n]`` are the coordinates of the ``C`` channels of one irrep in its canonical
    basis (:func:`invariant_basis`); the persistent buffer ``basis_version`` (:data:`BASIS_VERSION`) says
    so in the state dict. A state dict without it predates the canonical basis: its coefficients are
    converted on load from :func:`legacy_invariant_basis` recomputed here (:meth:`upgrade_state_dict_`).

    Args:
        group: G.
        centers: ``[M, 2]`` patch centres (token order), G-stable.
        ftype: token feature type.
        std: init std of the coefficients.
        basis: per irrep (in ``ftype.blocks()`` order) an explicit ``[n, M, d]`` orthonormal basis; the
            coefficients are coordinates in it, and a state dict without ``basis_version`` is read as it is.
    """

    def __init__(self, group, centers: np.ndarray, ftype: FeatureType, std: float = 0.02, basis=None) -> None:
        super().__init__()
        self.ftype = ftype
        self.in_type = self.out_type = ftype
        self.centers = np.array(centers, dtype=np.float64)  # kept for restriction to a subgroup
        self.num_tokens = len(centers)
        perms = permutations_for(np.asarray(centers, dtype=np.float64), group.elements) if basis is None else None
        self._perms = perms  # to recompute the legacy basis for a state dict that predates the canonical one
        self.pos_embed = nn.ParameterList()
        self._used: list[tuple[int, int, int]] = []  # (block, parameter, width) for blocks with invariants
        self._widths = []
        for n, (_, rho, c, _) in enumerate(ftype.blocks()):
            B = invariant_basis(perms, rho.matrices) if basis is None else np.asarray(basis[n])
            self._widths.append(c * rho.dim)
            if len(B) == 0:  # no invariant encoding in this irrep: it stays zero
                continue
            self.register_exact_buffer(f"basis_{n}", torch.from_numpy(np.ascontiguousarray(B)))
            self._used.append((n, len(self.pos_embed), c * rho.dim))
            self.pos_embed.append(nn.Parameter(torch.randn(c, len(B)) * std))
        self.register_buffer("basis_version", torch.tensor(BASIS_VERSION, dtype=torch.int64))

    def upgrade_state_dict_(self, state: dict[str, torch.Tensor], prefix: str = "") -> None:
        """Bring a state dict written before the canonical basis (no ``{prefix}basis_version``) to it, in place.

        Each ``pos_embed.{k}`` of the right shape is mapped from the legacy eigh basis to the canonical
        one (``coeff_new = coeff_old B_old B_new^T``, flattened bases); missing or misshapen ones are left
        for ``load_state_dict`` to report. The conversion is exact only when this numpy/LAPACK build's
        ``eigh`` returns the basis that the build which wrote the checkpoint returned (the legacy basis is
        a build-dependent choice in a degenerate eigenspace): a warning says so. With an explicit
        ``basis`` the coefficients were always coordinates in it, and nothing is converted.
        """
        version_key = prefix + "basis_version"
        if version_key in state:
            return
        converted = []
        if self._perms is not None:
            blocks = self.ftype.blocks()
            for n, k, _ in self._used:
                key = f"{prefix}pos_embed.{k}"
                coeff = state.get(key)
                if coeff is None or tuple(coeff.shape) != tuple(self.pos_embed[k].shape):
                    continue
                state[key] = self._from_legacy_basis(coeff, n, blocks[n][1].matrices)
                converted.append(f"pos_embed.{k}")
        state[version_key] = torch.tensor(BASIS_VERSION, dtype=torch.int64)
        if converted:
            warnings.warn(
                f"{prefix.rstrip('.') or 'InvariantAPE'}: no basis_version in the state dict, so "
                f"{', '.join(converted)} were read as "
                "coordinates in eqvit's legacy eigh basis of the invariant APE and converted to the canonical "
                "basis; exact only if this numpy/LAPACK build's eigh gives the basis of the build that wrote "
                "them (compare the model's outputs)",
                stacklevel=2,
            )

    def _from_legacy_basis(self, coeff: torch.Tensor, n: int, matrices: np.ndarray) -> torch.Tensor:
        """``[C, n]`` coordinates in the legacy basis of block ``n`` -> the same encoding's in the canonical one."""
        old = torch.from_numpy(legacy_invariant_basis(self._perms, matrices)).flatten(1)  # [n, M d]
        new = self._exact_masters[f"basis_{n}"].flatten(1)
        change = (old @ new.T).to(coeff.device)  # orthogonal [n, n]: both span the invariants
        return (coeff.to(torch.float64) @ change).to(coeff.dtype)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        self.upgrade_state_dict_(state_dict, prefix)
        version = state_dict[prefix + "basis_version"]
        if version.numel() == 1 and int(version) != BASIS_VERSION:
            errors.append(
                f"{prefix}basis_version is {int(version)} in the state dict; this eqvit reads invariant APE "
                f"coefficients in basis version {BASIS_VERSION} (or in the legacy basis, without the key)"
            )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)

    def embedding(self) -> torch.Tensor:
        """``[M, V.dim]`` the encoding p."""
        return self.embedding_reference()

    def embedding_reference(self) -> torch.Tensor:
        """``[M, V.dim]`` the encoding p, computed afresh (one einsum per irrep)."""
        ref = self.pos_embed[0] if len(self.pos_embed) else None
        parts = [
            torch.zeros(
                self.num_tokens,
                width,
                dtype=ref.dtype if ref is not None else None,
                device=ref.device if ref is not None else None,
            )
            for width in self._widths
        ]
        for n, k, _ in self._used:
            B = getattr(self, f"basis_{n}")  # [k, M, d]
            parts[n] = self.ftype.flatten_copies(torch.einsum("ck,kmd->mcd", self.pos_embed[k], B))
        return torch.cat(parts, dim=-1)

    @torch.no_grad()
    def load_embedding_(self, p: np.ndarray | torch.Tensor, atol: float = 1e-9) -> None:
        """Set the coefficients so that :meth:`embedding` is ``p [M, V.dim]``; ValueError when ``p`` is not
        invariant (its part outside the invariant basis is not negligible). Used to restrict models."""
        p = torch.as_tensor(np.asarray(p, dtype=np.float64))
        if tuple(p.shape) != (self.num_tokens, self.ftype.dim):
            expected = [self.num_tokens, self.ftype.dim]
            raise ValueError(f"expected an encoding of shape {expected}, got {list(p.shape)}")
        recon = torch.zeros_like(p)
        blocks = self.ftype.blocks()
        for n, k, _ in self._used:
            coords = torch.as_tensor(self.ftype.block_coords(blocks[n][0]))  # [C, d] in the type's layout
            B = self._exact_masters[f"basis_{n}"]  # [k, M, d], orthonormal
            coeff = torch.einsum("mcd,kmd->ck", p[:, coords], B)
            self.pos_embed[k].copy_(coeff.to(self.pos_embed[k].dtype))
            recon[:, coords] = torch.einsum("ck,kmd->mcd", coeff, B)
        err = (recon - p).abs().max().item() if p.numel() else 0.0
        if err > atol * max(1.0, p.abs().max().item() if p.numel() else 1.0):
            raise ValueError(f"the encoding is not invariant for {self.ftype.group.name}: residual {err:.3e}")

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.num_tokens:
            raise ValueError(f"expected {self.num_tokens} tokens, got {x.shape[1]}")
        return x + self.embedding()

    def fold(self) -> nn.Module:
        """The inference form: the encoding fixed."""
        from eqvit.nn.folded import FoldedAPE

        return FoldedAPE(self.embedding())


class FrameInvariantAPE(InvariantAPE):
    """The invariant APE for frame features (C copies of the regular representation on frames).

    Built in the irrep basis (:class:`InvariantAPE` on ``ftype.in_irrep_basis()``) and mapped to the
    frames with the inverse Fourier transform: ``p_frames = p_irrep @ fourier^T``. Since the transform
    intertwines the actions, ``p_frames`` is invariant under the frame permutations. With ``coefficients``
    (a :class:`~eqvit.nn.regular.RegularBasis`) the encoding is added to Fourier-coefficient tokens:
    ``p_frames @ coefficients.transform``, the same parameters and encoding.
    """

    def __init__(self, group, centers: np.ndarray, ftype: FeatureType, std: float = 0.02, coefficients=None) -> None:
        if ftype.basis != "frames":
            raise ValueError(f"FrameInvariantAPE reads frame features, got {ftype}")
        super().__init__(group, centers, ftype.in_irrep_basis(), std)
        self.frame_type = ftype
        to_tokens = np.array(ftype.fourier.T)
        if coefficients is not None:
            to_tokens = to_tokens @ coefficients.transform
        self.in_type = self.out_type = ftype if coefficients is None else coefficients.ftype
        self.register_exact_buffer("to_tokens", torch.from_numpy(to_tokens))

    def load_embedding_(self, p: np.ndarray | torch.Tensor, atol: float = 1e-9) -> None:
        """Set the coefficients from an encoding in the tokens' basis ``p [M, |G| C]``."""
        p = torch.as_tensor(np.asarray(p, dtype=np.float64))
        super().load_embedding_(p @ self._exact_masters["to_tokens"].T, atol)  # the inverse of p_irrep @ to_tokens

    def embedding_reference(self) -> torch.Tensor:
        """``[M, |G| C]`` the encoding in the tokens' basis."""
        p = super().embedding_reference()
        return p @ self.to_tokens.to(p.dtype)
