"""Learnable G-invariant absolute positional encoding (O(2) seed, Sec. 4.2.2, eq. 8).

``PosEnc(x) = x + p`` is equivariant iff ``rho(g) p_rho(g^-1 . a) = p_rho(a)`` for every irrep. A basis
of the invariant subspace of ``R^M (x) V_rho`` is precomputed; each channel of ``p_rho`` is a learned
combination of it (``eqvit.fold`` fixes ``p``).

The basis is canonical (:func:`invariant_basis`): built from the orbits of the points and the fixed
spaces of their stabilisers by a hand-written Gram-Schmidt, so the learned coefficients mean the same
encoding under every numpy/LAPACK build.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from eqvit.geometry.points import permutations_for
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.posenc.base import PositionalScheme


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
    the basis does not depend on the LAPACK build (an eigendecomposition of the group-averaged projector
    would: its eigenspace is degenerate, so the basis it returns is the build's choice).

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


class InvariantAPE(PositionalScheme, ExactBuffers):
    """``x [B, M, V.dim] -> x + p`` with ``p`` G-invariant on the patch centres.

    ``pos_embed.{k}`` ``[C, n]`` are the coordinates of the ``C`` channels of one irrep in its canonical
    basis (:func:`invariant_basis`).

    Args:
        group: G.
        centers: ``[M, 2]`` patch centres (token order), G-stable.
        ftype: token feature type.
        std: init std of the coefficients.
        basis: per irrep (in ``ftype.blocks()`` order) an explicit ``[n, M, d]`` orthonormal basis; the
            coefficients are coordinates in it.
    """

    def __init__(self, group, centers: np.ndarray, ftype: FeatureType, std: float = 0.02, basis=None) -> None:
        super().__init__()
        self.in_type = self.out_type = ftype
        self.embedding_type = ftype  # the layout of the encoding's coefficients (subclasses map it to the tokens)
        self.centers = np.array(centers, dtype=np.float64)  # kept for restriction to a subgroup
        self.num_tokens = len(centers)
        perms = permutations_for(np.asarray(centers, dtype=np.float64), group.elements) if basis is None else None
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
            parts[n] = self.embedding_type.flatten_copies(torch.einsum("ck,kmd->mcd", self.pos_embed[k], B))
        return torch.cat(parts, dim=-1)

    @torch.no_grad()
    def load_embedding_(self, p: np.ndarray | torch.Tensor, atol: float = 1e-9) -> None:
        """Set the coefficients so that :meth:`embedding` is ``p [M, V.dim]``; ValueError when ``p`` is not
        invariant (its part outside the invariant basis is not negligible). Used to restrict models."""
        p = torch.as_tensor(np.asarray(p, dtype=np.float64))
        if tuple(p.shape) != (self.num_tokens, self.embedding_type.dim):
            expected = [self.num_tokens, self.embedding_type.dim]
            raise ValueError(f"expected an encoding of shape {expected}, got {list(p.shape)}")
        recon = torch.zeros_like(p)
        blocks = self.embedding_type.blocks()
        for n, k, _ in self._used:
            coords = torch.as_tensor(self.embedding_type.block_coords(blocks[n][0]))  # [C, d] in the type's layout
            B = self.exact_buffer(f"basis_{n}")  # [k, M, d], orthonormal
            coeff = torch.einsum("mcd,kmd->ck", p[:, coords], B)
            self.pos_embed[k].copy_(coeff.to(self.pos_embed[k].dtype))
            recon[:, coords] = torch.einsum("ck,kmd->mcd", coeff, B)
        err = (recon - p).abs().max().item() if p.numel() else 0.0
        if err > atol * max(1.0, p.abs().max().item() if p.numel() else 1.0):
            raise ValueError(f"the encoding is not invariant for {self.embedding_type.group.name}: residual {err:.3e}")

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        # torch._assert: the model makes the tokens (its input check covers user input); traceable by torch.fx
        torch._assert(x.shape[1] == self.num_tokens, f"expected {self.num_tokens} tokens")
        return x + self.embedding()

    def fold(self) -> nn.Module:
        """The inference form: the encoding fixed."""
        from eqvit.nn.folded import FoldedAPE

        return FoldedAPE(self.embedding())

    def fold_in_stream(self, basis: nn.Module) -> nn.Module:
        """The inference form adding to tokens kept in ``basis`` (:class:`~eqvit.nn.stream.StreamBasis`)."""
        from eqvit.nn.folded import FoldedAPE

        return FoldedAPE(basis.to_stream(self.embedding()))  # no in_type: no FeatureType describes the stream basis


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
        super().load_embedding_(p @ self.exact_buffer("to_tokens").T, atol)  # the inverse of p_irrep @ to_tokens

    def embedding_reference(self) -> torch.Tensor:
        """``[M, |G| C]`` the encoding in the tokens' basis."""
        p = super().embedding_reference()
        return p @ self.to_tokens.to(p.dtype)
