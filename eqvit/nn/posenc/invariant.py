"""Learnable G-invariant absolute positional encoding (O(2) seed, Sec. 4.2.2, eq. 8).

``PosEnc(x) = x + p`` is equivariant iff ``rho(g) p_rho(g^-1 . a) = p_rho(a)`` for every irrep. A basis
of the invariant subspace of ``R^H (x) V_rho`` (the fixed space of ``P_H(g) (x) rho(g)``) is
precomputed; each channel of ``p_rho`` is a learned combination of it (``eqvit.fuse`` fixes ``p``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from eqvit.geometry.points import permutations_for
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.posenc.base import PositionalScheme


def invariant_basis(perms: np.ndarray, matrices: np.ndarray) -> np.ndarray:
    """Orthonormal basis ``[n, M, d]`` of ``{p in R^M (x) R^d : rho(g) p(g^-1 a) = p(a)}``.

    Args:
        perms: ``[order, M]`` with ``points[perms[g, a]] = g points[a]``.
        matrices: ``[order, d, d]`` the irrep.
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

    Args:
        group: G.
        centers: ``[M, 2]`` patch centres (token order), G-stable.
        ftype: token feature type.
        std: init std of the coefficients.
        basis: per irrep (in ``ftype.blocks()`` order) an explicit ``[n, M, d]`` basis (restriction).
    """

    def __init__(self, group, centers: np.ndarray, ftype: FeatureType, std: float = 0.02, basis=None) -> None:
        super().__init__()
        self.ftype = ftype
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


class FrameInvariantAPE(InvariantAPE):
    """The invariant APE for frame features (C copies of the regular representation on frames).

    Built in the irrep basis (:class:`InvariantAPE` on ``ftype.in_irrep_basis()``) and mapped to the
    frames with the inverse Fourier transform: ``p_frames = p_irrep @ fourier^T``. Since the transform
    intertwines the actions, ``p_frames`` is invariant under the frame permutations.
    """

    def __init__(self, group, centers: np.ndarray, ftype: FeatureType, std: float = 0.02) -> None:
        if ftype.basis != "frames":
            raise ValueError(f"FrameInvariantAPE reads frame features, got {ftype}")
        super().__init__(group, centers, ftype.in_irrep_basis(), std)
        self.frame_type = ftype
        self.register_exact_buffer("to_frames", torch.from_numpy(np.array(ftype.fourier.T)))

    def load_embedding_(self, p: np.ndarray | torch.Tensor, atol: float = 1e-9) -> None:
        """Set the coefficients from an encoding on the frames ``p [M, |G| C]``."""
        p = torch.as_tensor(np.asarray(p, dtype=np.float64))
        super().load_embedding_(p @ self._exact_masters["to_frames"].T, atol)  # the inverse of p_irrep @ to_frames

    def embedding_reference(self) -> torch.Tensor:
        """``[M, |G| C]`` the encoding on the frames."""
        p = super().embedding_reference()
        return p @ self.to_frames.to(p.dtype)
