"""Irrep-wise equivariant affine maps (O(2) seed, eq. 4-5).

By Schur's lemma ``Hom_G(V', V'') = (+)_rho Mat_{C''_rho x C'_rho}(R) (x) End_G(V_rho)``: a real-type
irrep only mixes channels (``w (x) I``), a complex-type irrep uses ``w1 (x) I + w2 (x) J``
(quaternionic: four basis elements). A bias is allowed on the trivial irrep only.

The dense matrix is assembled by one gather from the flat parameter vector (``W = sum_k
theta[index_k] * coef_k``, ``k < dim End``) on every call; ``eqvit.fuse`` fixes it for inference.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType


class IrrepLinear(ExactBuffers):
    """``V' -> V''``: ``W = (W_rho)``, ``W_rho = sum_i w_i (x) L_i`` (eq. 4), plus a trivial-irrep bias (eq. 5).

    Args:
        in_type, out_type: feature types of the same group.
        bias: learn a bias on the trivial irrep of ``out_type``.

    Parameters: ``weights[n]`` of shape ``[dim End(V_rho), C''_rho, C'_rho]`` for every irrep present
    in both types, ``bias [C''_trivial]``. The dense ``[out.dim, in.dim]`` matrix is
    :meth:`weight_matrix` (one gather per call); ``forward`` is one
    ``F.linear``.
    """

    def __init__(self, in_type: FeatureType, out_type: FeatureType, bias: bool = True) -> None:
        super().__init__()
        if in_type.group is not out_type.group:
            raise ValueError(f"in and out types must share a group, got {in_type.group.name} and {out_type.group.name}")
        self.in_type, self.out_type = in_type, out_type
        self.weights = nn.ParameterList()
        self._blocks: list[tuple[int, slice, slice, int, int, int]] = []
        in_blocks = {i: (c, sl) for i, _, c, sl in in_type.blocks()}
        # W[r, c] = sum_k theta[index[k, r, c]] * coef[k, r, c] with theta the flat parameters.
        endo = []
        for i, rho, c_out, out_sl in out_type.blocks():
            if i not in in_blocks:
                continue
            c_in, in_sl = in_blocks[i]
            # Basis of End_G(V_rho): identity first, then J (complex) ...; scaled to L_1 = I.
            basis = rho.endomorphism_basis * math.sqrt(rho.dim)
            self.register_exact_buffer(f"endo_{len(self._blocks)}", torch.from_numpy(basis))
            w = nn.Parameter(torch.empty(len(basis), c_out, c_in))
            bound = 1.0 / math.sqrt(c_in * len(basis))
            nn.init.uniform_(w, -bound, bound)
            self.weights.append(w)
            self._blocks.append((len(self._blocks), out_sl, in_sl, c_out, c_in, rho.dim))
            endo.append(basis)
        K = max((len(L) for L in endo), default=1)
        index = np.zeros((K, out_type.dim, in_type.dim), dtype=np.int64)
        coef = np.zeros((K, out_type.dim, in_type.dim))
        start = 0
        for (_, out_sl, in_sl, c_out, c_in, d), L in zip(self._blocks, endo):
            k = len(L)
            flat = start + np.arange(k * c_out * c_in).reshape(k, c_out, c_in)  # theta index of w[k, o, i]
            # Entry (o d + a, i d + b) of the block is sum_k w[k, o, i] L[k, a, b].
            index[:k, out_sl, in_sl] = np.broadcast_to(flat[:, :, None, :, None], (k, c_out, d, c_in, d)).reshape(
                k, c_out * d, c_in * d
            )
            coef[:k, out_sl, in_sl] = np.broadcast_to(L[:, None, :, None, :], (k, c_out, d, c_in, d)).reshape(
                k, c_out * d, c_in * d
            )
            start += flat.size
        self.register_buffer("_gather_index", torch.from_numpy(index), persistent=False)
        self.register_exact_buffer("_gather_coef", torch.from_numpy(coef))
        triv = [(c, sl) for i, rho, c, sl in out_type.blocks() if rho.is_trivial]
        if bias and triv:
            self.bias = nn.Parameter(torch.zeros(triv[0][0]))
            self._bias_slice = triv[0][1]
            # bias_vector = cat([bias, 0])[bias_index]: the trivial coordinates read the bias, the rest 0.
            bias_index = np.full(out_type.dim, triv[0][0], dtype=np.int64)
            bias_index[self._bias_slice] = np.arange(triv[0][0])
            self.register_buffer("_bias_index", torch.from_numpy(bias_index), persistent=False)
        else:
            self.register_parameter("bias", None)
            self._bias_slice = None

    def extra_repr(self) -> str:
        return f"{self.in_type} -> {self.out_type}, bias={self.bias is not None}"

    def _dense_weight(self) -> torch.Tensor:
        coef = self._gather_coef
        if not len(self.weights):
            return coef.new_zeros(self.out_type.dim, self.in_type.dim)
        theta = (
            torch.cat([w.reshape(-1) for w in self.weights]) if len(self.weights) > 1 else self.weights[0].reshape(-1)
        )
        W = theta[self._gather_index] * coef
        return W[0] if len(W) == 1 else W.sum(0)

    def _dense_bias(self) -> torch.Tensor | None:
        if self.bias is None:
            return None
        return torch.cat([self.bias, self.bias.new_zeros(1)])[self._bias_index]

    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight [out.dim, in.dim], bias [out.dim] or None)`` (computed on every call; eqvit.fuse fixes them)."""
        return self._dense_weight(), self._dense_bias()

    def leaves(self) -> list[torch.Tensor | None]:
        """The parameters, read afresh (plain dict lookups: this runs on every forward)."""
        return [*self._modules["weights"]._parameters.values(), self._parameters["bias"]]

    def weight_matrix(self) -> torch.Tensor:
        """Dense ``[out.dim, in.dim]`` matrix of the linear part."""
        return self.dense()[0]

    def bias_vector(self) -> torch.Tensor | None:
        """The bias as a ``[out.dim]`` vector (zero outside the trivial irrep), or None."""
        return self.dense()[1]

    def weight_matrix_reference(self) -> torch.Tensor:
        """Dense matrix assembled block by block with ``einsum`` (reference for the gather)."""
        ref = self.weights[0] if len(self.weights) else None
        dtype = ref.dtype if ref is not None else torch.get_default_dtype()
        device = ref.device if ref is not None else None
        W = torch.zeros(self.out_type.dim, self.in_type.dim, dtype=dtype, device=device)
        for n, out_sl, in_sl, c_out, c_in, d in self._blocks:
            L = getattr(self, f"endo_{n}")
            W[out_sl, in_sl] = torch.einsum("koi,kde->odie", self.weights[n], L).reshape(c_out * d, c_in * d)
        return W

    def block_weight(self, n: int) -> torch.Tensor:
        """``[C''_rho d, C'_rho d]`` matrix ``sum_k w_k (x) L_k`` of the n-th irrep block."""
        _, _, _, c_out, c_in, d = self._blocks[n]
        if d == 1:
            return self.weights[n][0] * getattr(self, f"endo_{n}")[0, 0, 0]
        return torch.einsum("koi,kde->odie", self.weights[n], getattr(self, f"endo_{n}")).reshape(c_out * d, c_in * d)

    def forward_blockwise(self, x: torch.Tensor) -> torch.Tensor:
        """One matmul per irrep (Schur's block structure): ``sum_rho C''_rho C'_rho d_rho^2``
        instead of ``dim'' dim'`` multiply-adds per token, but one op per irrep."""
        by_out = {out_sl.start: n for n, out_sl, *_ in self._blocks}
        parts = []
        for _, rho, c, out_sl in self.out_type.blocks():
            n = by_out.get(out_sl.start)
            if n is None:
                parts.append(x.new_zeros(*x.shape[:-1], c * rho.dim))
                continue
            in_sl = self._blocks[n][2]
            bias = self.bias if self.bias is not None and out_sl == self._bias_slice else None
            parts.append(F.linear(x[..., in_sl], self.block_weight(n), bias))
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in.dim] -> [..., out.dim]``: ``F.linear(x, weight_matrix(), bias_vector())``."""
        return F.linear(x, *self.dense())

    @torch.no_grad()
    def load_dense_(
        self, W: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor | None = None, atol: float = 1e-8
    ) -> None:
        """Set the parameters from a dense equivariant ``W [out.dim, in.dim]`` (and bias ``b``).

        Projects ``W`` onto the irrep-wise parametrisation and raises ValueError if the rest is not
        negligible (``W`` is not G-equivariant); used to restrict models (Theorem 2, Lemma 2).
        """
        W = torch.as_tensor(np.asarray(W, dtype=np.float64))
        recon = torch.zeros_like(W)
        for n, out_sl, in_sl, c_out, c_in, d in self._blocks:
            L = self._exact_masters[f"endo_{n}"]
            block = W[out_sl, in_sl].reshape(c_out, d, c_in, d)
            # The L_k are orthogonal with |L_k|_F^2 = d.
            w = torch.einsum("odie,kde->koi", block, L) / d
            self.weights[n].copy_(w.to(self.weights[n].dtype))
            recon[out_sl, in_sl] = torch.einsum("koi,kde->odie", w, L).reshape(c_out * d, c_in * d)
        err = (recon - W).abs().max().item() if W.numel() else 0.0
        if err > atol * max(1.0, W.abs().max().item() if W.numel() else 1.0):
            raise ValueError(f"matrix is not equivariant for {self.out_type.group.name}: residual {err:.3e}")
        if b is not None:
            b = torch.as_tensor(np.asarray(b, dtype=np.float64))
            rest = b.clone()
            if self.bias is not None:
                self.bias.copy_(b[self._bias_slice].to(self.bias.dtype))
                rest[self._bias_slice] = 0
            if rest.abs().max().item() > atol * max(1.0, b.abs().max().item()):
                raise ValueError("bias has components outside the trivial irrep (or the layer has no bias)")
