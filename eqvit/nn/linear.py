"""Irrep-wise equivariant affine maps (O(2) seed, eq. 4-5).

By Schur's lemma ``Hom_G(V', V'') = (+)_rho Mat_{C''_rho x C'_rho}(R) (x) End_G(V_rho)``: a real-type
irrep only mixes channels (``w (x) I``), a complex-type irrep uses ``w1 (x) I + w2 (x) J``
(quaternionic: four basis elements). A bias is allowed on the trivial irrep only.

Two forwards, chosen at construction from the feature types' layouts:

* both types in the ``"components"`` layout (:mod:`eqvit.nn.irrep_features`): block matmuls at the
  Schur minimum (:mod:`eqvit.nn.schur`). A real-type irrep's block ``w (x) I`` acts on the ``[d, C]``
  component-major block as one ``[C'', C']`` matmul per component slab (``sum_rho d_rho C''_rho C'_rho``
  multiply-adds); a complex or quaternionic block ``sum_k L_k (x) w_k`` is one ``[d C'', d C']`` matmul (its
  two- or four-matrix form, ``d^2 C'' C'`` = ``type_factor * d * C'' C'``). For D4 regular features that is
  12/64 of the dense multiply-adds.
* otherwise one ``F.linear`` on the dense matrix, assembled by one gather from the flat parameter
  vector (``W = sum_k theta[index_k] * coef_k``, ``k < dim End``) on every call.

:meth:`IrrepLinear.fold` fixes either for inference (:func:`eqvit.fold`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.schur import SlabPlan, apply_slabs, slab_matmul, slab_plan


class IrrepLinear(ExactBuffers):
    """``V' -> V''``: ``W = (W_rho)``, ``W_rho = sum_i w_i (x) L_i`` (eq. 4), plus a trivial-irrep bias (eq. 5).

    Args:
        in_type, out_type: feature types of the same group.
        bias: learn a bias on the trivial irrep of ``out_type``.

    Parameters: ``weight``, one flat vector holding a ``[dim End(V_rho), C''_rho, C'_rho]`` block for every
    irrep present in both types (:meth:`weight_blocks`, views of it; e3nn's ``o3.Linear`` keeps its paths'
    weights the same way), and ``bias [C''_trivial]``. The dense ``[out.dim, in.dim]`` matrix is
    :meth:`weight_matrix` (one gather per call); ``forward`` is block matmuls (``components`` layouts) or one
    ``F.linear``.
    """

    def __init__(self, in_type: FeatureType, out_type: FeatureType, bias: bool = True) -> None:
        super().__init__()
        if in_type.group is not out_type.group:
            raise ValueError(f"in and out types must share a group, got {in_type.group.name} and {out_type.group.name}")
        self.in_type, self.out_type = in_type, out_type
        self._block_shapes: list[tuple[int, int, int]] = []  # [dim End(V_rho), C'', C'] per parameter block
        self._blocks: list[tuple[int, slice, slice, int, int, int]] = []
        in_blocks = {i: (c, sl) for i, _, c, sl in in_type.blocks()}
        self._coords = []  # (out coords [C'', d], in coords [C', d]) per parameter block
        self._block_irreps: list[int] = []  # irrep index of each parameter block
        endo = []
        for i, rho, c_out, out_sl in out_type.blocks():
            if i not in in_blocks:
                continue
            c_in, in_sl = in_blocks[i]
            # Basis of End_G(V_rho): identity first, then J (complex) ...; scaled to L_1 = I.
            basis = rho.endomorphism_basis * math.sqrt(rho.dim)
            self.register_exact_buffer(f"endo_{len(self._blocks)}", torch.from_numpy(basis))
            self._block_shapes.append((len(basis), c_out, c_in))
            self._blocks.append((len(self._blocks), out_sl, in_sl, c_out, c_in, rho.dim))
            self._coords.append((out_type.block_coords(i), in_type.block_coords(i)))
            self._block_irreps.append(i)
            endo.append(basis)
        self._block_sizes = [k * o * i for k, o, i in self._block_shapes]
        self.weight = nn.Parameter(torch.empty(sum(self._block_sizes)))
        with torch.no_grad():
            for w in self.weight_blocks():
                bound = 1.0 / math.sqrt(w.shape[2] * w.shape[0])
                nn.init.uniform_(w, -bound, bound)
        # Schur layers assemble their (rarely needed) dense matrix block by block: a gather table of
        # ``out.dim x in.dim`` entries per layer would take gigabytes at ViT-B widths.
        self.schur = in_type.layout == out_type.layout == "components"
        self._dense_impl = _blockwise_dense if self.schur else _gathered_dense
        if not self.schur:
            self._register_gather(endo)
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
        # The Schur plan of the "components" layout: output slabs, their input slab, and which parameter
        # block builds their matrix (its sign: the first endomorphism basis element is +-I).
        self._impl = _schur_forward if self.schur else _dense_forward
        self._matmul_impl = _schur_matmul if self.schur else _dense_matmul
        if self.schur:
            self.plan: SlabPlan = slab_plan(in_type, out_type)
            by_irrep = {i: n for n, i in enumerate(self._block_irreps)}
            slab_irreps = [i for i, rho, _, _ in out_type.blocks() for _ in range(rho.dim if rho.type == "real" else 1)]
            self._term_blocks = [by_irrep.get(i, -1) for i in slab_irreps]  # parameter block per output slab
            self._block_signs = [float(L[0, 0, 0]) if len(L) == 1 else 0.0 for L in endo]
            trivial = [t for t, i in enumerate(slab_irreps) if out_type.irreps[i].is_trivial]
            self._bias_term = trivial[0] if trivial else None

    def _register_gather(self, endo: list[np.ndarray]) -> None:
        """The table of :meth:`_gathered_weight`: ``W[r, c] = sum_k theta[index[k, r, c]] * coef[k, r, c]``."""
        K = max((len(L) for L in endo), default=1)
        index = np.zeros((K, self.out_type.dim, self.in_type.dim), dtype=np.int64)
        coef = np.zeros((K, self.out_type.dim, self.in_type.dim))
        start = 0
        for (_, _, _, c_out, c_in, _d), L, (oc, ic) in zip(self._blocks, endo, self._coords):
            k = len(L)
            flat = start + np.arange(k * c_out * c_in).reshape(k, c_out, c_in)  # theta index of w[k, o, i]
            # Entry (component a of out copy o, component b of in copy i) is sum_k w[k, o, i] L[k, a, b].
            rows, cols = oc[:, :, None, None], ic[None, None, :, :]
            index[:k, rows, cols] = flat[:, :, None, :, None]
            coef[:k, rows, cols] = L[:, None, :, None, :]
            start += flat.size
        self.register_buffer("_gather_index", torch.from_numpy(index), persistent=False)
        self.register_exact_buffer("_gather_coef", torch.from_numpy(coef))

    def extra_repr(self) -> str:
        return f"{self.in_type} -> {self.out_type}, bias={self.bias is not None}, schur={self.schur}"

    def weight_blocks(self) -> list[torch.Tensor]:
        """The irrep blocks of :attr:`weight`, views ``[dim End(V_rho), C''_rho, C'_rho]`` in parameter-block order."""
        weight = self._parameters["weight"]
        chunks = weight.split(self._block_sizes) if len(self._block_sizes) > 1 else (weight,)
        return [chunk.view(shape) for chunk, shape in zip(chunks, self._block_shapes)]

    def schur_mats(self) -> list[torch.Tensor | None]:
        """The matrix of every output slab of :attr:`plan` (``components`` layouts): ``w`` ``[C'', C']``
        for a real-type component, ``sum_k L_k (x) w_k`` ``[d C'', d C']`` otherwise, None for zeros."""
        weights = self.weight_blocks()
        mats, cache = [], {}
        for n in self._term_blocks:
            if n < 0:
                mats.append(None)
                continue
            if n not in cache:
                w, sign = weights[n], self._block_signs[n]
                if sign:  # real type: L = +-I (squeeze, a view: indexing's backward would zero-fill the block)
                    cache[n] = w.squeeze(0) if sign > 0 else -w.squeeze(0)
                else:
                    L = self._buffers[f"endo_{n}"]
                    _, c_out, c_in = w.shape
                    d = L.shape[-1]
                    cache[n] = torch.einsum("kab,koi->aobi", L, w).reshape(d * c_out, d * c_in)
            mats.append(cache[n])
        return mats

    def schur_biases(self) -> list[torch.Tensor | None]:
        """The bias of every output slab of :attr:`plan` (the trivial irrep's slab only)."""
        out: list[torch.Tensor | None] = [None] * len(self.plan.terms)
        if self.bias is not None and self._bias_term is not None:
            out[self._bias_term] = self._parameters["bias"]
        return out

    def slab_weights(self) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """``(matrices, biases)`` of the output slabs of :attr:`plan` (:mod:`eqvit.nn.schur`)."""
        return self.schur_mats(), self.schur_biases()

    def _dense_weight(self) -> torch.Tensor:
        return self._dense_impl(self)

    def _gathered_weight(self) -> torch.Tensor:
        coef = self._gather_coef
        if not self._block_shapes:
            return coef.new_zeros(self.out_type.dim, self.in_type.dim)
        W = self._parameters["weight"][self._gather_index] * coef
        return W[0] if len(W) == 1 else W.sum(0)

    def _dense_bias(self) -> torch.Tensor | None:
        if self.bias is None:
            return None
        return torch.cat([self.bias, self.bias.new_zeros(1)])[self._bias_index]

    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight [out.dim, in.dim], bias [out.dim] or None)`` (computed on every call; eqvit.fold fixes them)."""
        return self._dense_weight(), self._dense_bias()

    def weight_matrix(self) -> torch.Tensor:
        """Dense ``[out.dim, in.dim]`` matrix of the linear part."""
        return self.dense()[0]

    def bias_vector(self) -> torch.Tensor | None:
        """The bias as a ``[out.dim]`` vector (zero outside the trivial irrep), or None."""
        return self._dense_bias()

    def matmul(self, other: torch.Tensor) -> torch.Tensor:
        """``W @ other``: the linear part on the columns of ``other [in.dim, k]`` -> ``[out.dim, k]``; slab by slab
        in ``components`` layouts (the Schur minimum of multiply-adds, no dense ``W``)."""
        return self._matmul_impl(self, other)

    def weight_matrix_reference(self) -> torch.Tensor:
        """Dense matrix assembled block by block with ``einsum`` (reference for the gather)."""
        W = self.weight.new_zeros(self.out_type.dim, self.in_type.dim)
        for n, out_sl, in_sl, *_ in self._blocks:
            W[out_sl, in_sl] = self.block_weight(n)
        return W

    def block_weight(self, n: int) -> torch.Tensor:
        """``[C''_rho d, C'_rho d]`` matrix ``sum_k w_k (x) L_k`` of the n-th irrep block, rows and columns
        in the types' storage order inside the block (their layouts)."""
        _, out_sl, in_sl, c_out, c_in, d = self._blocks[n]
        dense = torch.einsum("koi,kde->odie", self.weight_blocks()[n], getattr(self, f"endo_{n}"))
        oc, ic = self._coords[n]
        rows = torch.from_numpy(np.argsort((oc - out_sl.start).reshape(-1)))  # storage position -> (o, a)
        cols = torch.from_numpy(np.argsort((ic - in_sl.start).reshape(-1)))
        return dense.reshape(c_out * d, c_in * d)[rows][:, cols]

    def forward_blockwise(self, x: torch.Tensor) -> torch.Tensor:
        """One matmul per irrep block (reference for the Schur forward): ``sum_rho C''_rho C'_rho
        d_rho^2`` multiply-adds per token, the blocks kept dense."""
        by_out = {out_sl.start: n for n, out_sl, *_ in self._blocks}
        parts = []
        for _, rho, c, out_sl in self.out_type.blocks():
            n = by_out.get(out_sl.start)
            if n is None:
                parts.append(x.new_zeros(*x.shape[:-1], c * rho.dim))
                continue
            in_sl = self._blocks[n][2]
            bias = self._dense_bias()[out_sl] if self.bias is not None and out_sl == self._bias_slice else None
            parts.append(F.linear(x[..., in_sl], self.block_weight(n), bias))
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in.dim] -> [..., out.dim]``: block matmuls (``components`` layouts) or one ``F.linear``."""
        return self._impl(self, x)

    def fold(self) -> nn.Module:
        """The inference form: the slab matrices (``components`` layouts) or the dense matrix fixed."""
        from eqvit.nn.folded import FoldedLinear, FoldedSchurLinear

        if self.schur:
            return FoldedSchurLinear(self.plan, *self.slab_weights(), in_type=self.in_type, out_type=self.out_type)
        return FoldedLinear(*self.dense(), in_type=self.in_type, out_type=self.out_type)

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
        blocks = self.weight_blocks()
        for (n, _, _, _, _, _), (oc, ic) in zip(self._blocks, self._coords):
            L = self.exact_buffer(f"endo_{n}")
            rows, cols = torch.from_numpy(oc)[:, :, None, None], torch.from_numpy(ic)[None, None, :, :]
            block = W[rows, cols]  # [C'', d, C', d]
            # The L_k are orthogonal with |L_k|_F^2 = d.
            w = torch.einsum("odie,kde->koi", block, L) / L.shape[-1]
            blocks[n].copy_(w.to(blocks[n].dtype))
            recon[rows, cols] = torch.einsum("koi,kde->odie", w, L)
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


def _dense_matmul(m: IrrepLinear, other: torch.Tensor) -> torch.Tensor:
    return m._dense_weight() @ other


def _schur_matmul(m: IrrepLinear, other: torch.Tensor) -> torch.Tensor:
    return slab_matmul(m.plan, m.schur_mats(), other)


def _dense_forward(m: IrrepLinear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, *m.dense())


def _schur_forward(m: IrrepLinear, x: torch.Tensor) -> torch.Tensor:
    return apply_slabs(x, m.plan, *m.slab_weights())


def _gathered_dense(m: IrrepLinear) -> torch.Tensor:
    return m._gathered_weight()


def _blockwise_dense(m: IrrepLinear) -> torch.Tensor:
    return m.weight_matrix_reference()
