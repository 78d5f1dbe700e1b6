"""Inference forms of the Schur (``components`` layout) layers, on the batched-matmul plans of
:mod:`eqvit.nn.slabs` (runs of equal slabs, coefficient rows).

* :class:`FrozenSchurLinear`: the frozen linear, ``[..., in.dim] -> [..., out.dim]``: one ``bmm`` per run
  of equal slabs, written straight into the output's column slabs (two per linear for D4 and C4, no
  ``split`` and no ``cat``; on a CPU that also means fewer fresh tensors, whose first touch costs as
  much as a GELU).
* :class:`FourierSlabMlp`: ``fc2 o FT sigma FT^-1 o fc1`` with a strided Fourier nonlinearity, its hidden
  features in coefficient rows ``H [s, T, n]``: fc1 writes the rows, the transform and its inverse are
  one ``[s, s] @ [s, T n]`` GEMM each, the GELU runs in place, fc2 reads the rows. Tokens go in chunks
  of :data:`CHUNK_TOKENS`, so the two hidden buffers of a chunk stay in the cache. The Fourier-basis
  Platonic attention (:mod:`eqvit.nn.fused_fourier`) moves q/k/v to the frames through the same rows.
* :class:`SchurCoupledAttention`: coupled-head attention on Schur q/k/v/projection runs, heads laid out
  for SDPA by one copy per run each way.

Each computes the same function as the training layer it replaces (tests check every registered
model in float64); :func:`eqvit.fuse` swaps them in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from eqvit.nn.sdpa import ScaledDotProductAttention
from eqvit.nn.slabs import (
    RowPlan,
    _offsets,
    apply_rows_in,
    apply_rows_out,
    matmul_into,
    row_plan_in,
    row_plan_out,
    run_view,
    slab_runs,
    stack_run,
    stack_run_bias,
)

# Tokens per chunk of FourierSlabMlp: at ViT-B width (hidden 3072) a chunk's two hidden buffers are
# 2 x 6 MB, at ViT-S 2 x 3 MB.
CHUNK_TOKENS = 512


def _stack(mats, run) -> torch.Tensor:
    return stack_run(mats, run).detach().clone().contiguous()


def _stack_bias(biases, run, like: torch.Tensor) -> torch.Tensor | None:
    bias = stack_run_bias(biases, run, like)
    return None if bias is None else bias.detach().clone()


def run_frozen(module: nn.Module, forward, x: torch.Tensor, *args) -> torch.Tensor:
    """``forward(x, buffers, *args)``; inside an autocast region in autocast's dtype, with the buffers cast to
    it and autocast off inside (the ``out=`` matmuls write into tensors of that dtype)."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return forward(x, module._buffers, *args)
    dtype = torch.get_autocast_dtype(device)
    buffers = {
        k: v if v is None or v.dtype == dtype or not v.is_floating_point() else v.to(dtype)
        for k, v in module._buffers.items()
    }
    with torch.autocast(device, enabled=False):
        return forward(x.to(dtype), buffers, *args)


class FrozenSchurLinear(nn.Module):
    """:class:`~eqvit.nn.linear.IrrepLinear` in the ``components`` layout with its slab matrices fixed,
    ``[..., in.dim] -> [..., out.dim]``: one batched matmul per run of equal slabs
    (:func:`~eqvit.nn.slabs.slab_runs`), written into the output's column slabs."""

    def __init__(self, lin: nn.Module) -> None:
        super().__init__()
        self.in_type, self.out_type = lin.in_type, lin.out_type
        self.sizes, self.terms = list(lin._in_sizes), list(lin._terms)
        self.out_dim = sum(width for _, width in self.terms)
        mats, biases = lin.schur_mats(), lin.schur_biases()
        like = next(m for m in mats if m is not None)
        self.runs = slab_runs(self.sizes, self.terms)
        self.zero_runs = [r for r in self.runs if r.in_width == 0]
        self.runs = [r for r in self.runs if r.in_width]
        for n, run in enumerate(self.runs):
            # Stored [count, in_width, out_width]: x [count, T, in] @ W.
            self.register_buffer(f"weight_{n}", _stack(mats, run).transpose(1, 2))
            bias = _stack_bias(biases, run, like)
            self.register_buffer(f"bias_{n}", bias)

    def extra_repr(self) -> str:
        return f"{self.in_type} -> {self.out_type}, runs={[r.count for r in self.runs]}"

    def slab_matrix(self, t: int) -> torch.Tensor:
        """The ``[out_width, in_width]`` matrix of output slab ``t`` (for other fused layers)."""
        for n, run in enumerate(self.runs):
            if run.first <= t < run.first + run.count:
                return self._buffers[f"weight_{n}"][t - run.first].T
        raise ValueError(f"output slab {t} of {self.out_type} has no input (a zero slab)")

    def slab_bias(self, t: int) -> torch.Tensor | None:
        """The ``[out_width]`` bias of output slab ``t``, or None."""
        for n, run in enumerate(self.runs):
            if run.first <= t < run.first + run.count:
                bias = self._buffers[f"bias_{n}"]
                return None if bias is None else bias[t - run.first, 0]
        return None

    def apply_to_slabs(self, slabs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The forward on an input already cut into its slabs."""
        return self(torch.cat(list(slabs), dim=-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in.dim] -> [..., out.dim]``."""
        return run_frozen(self, self._forward, x)

    def _forward(self, x: torch.Tensor, buffers: dict) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        out = flat.new_empty(flat.shape[0], self.out_dim)
        for n, run in enumerate(self.runs):
            matmul_into(
                run_view(out, run.out_start, run.count, run.out_width),
                run_view(flat, run.in_start, run.count, run.in_width),
                buffers[f"weight_{n}"],
                buffers[f"bias_{n}"],
            )
        for run in self.zero_runs:
            out[:, run.out_start : run.out_start + run.count * run.out_width].zero_()
        return out.view(*lead, self.out_dim)


def register_rows_out(module: nn.Module, prefix: str, lin: FrozenSchurLinear, row: int) -> list[RowPlan]:
    """:func:`~eqvit.nn.slabs.row_plan_out` of ``lin`` with its weights as buffers of ``module``:
    ``{prefix}_weight_m`` ``[count, in, row]`` and ``{prefix}_bias_m``."""
    plan = row_plan_out(lin.runs, row)
    for m, p in enumerate(plan):
        weight, bias = lin._buffers[f"weight_{p.run}"], lin._buffers[f"bias_{p.run}"]
        cols = slice(p.sub * row, (p.sub + 1) * row)
        module.register_buffer(f"{prefix}_weight_{m}", weight[:, :, cols].contiguous())
        module.register_buffer(f"{prefix}_bias_{m}", None if bias is None else bias[:, :, cols].contiguous())
    return plan


def register_rows_in(
    module: nn.Module, prefix: str, lin: FrozenSchurLinear, row: int
) -> tuple[list[RowPlan], list[RowPlan]]:
    """:func:`~eqvit.nn.slabs.row_plan_in` of ``lin`` with its weights as buffers of ``module``:
    ``{prefix}_{first|rest}_weight_m`` ``[count, row, out]`` and ``{prefix}_first_bias_m``."""
    plans = row_plan_in(lin.runs, row)
    for name, plan in zip(("first", "rest"), plans):
        for m, p in enumerate(plan):
            weight = lin._buffers[f"weight_{p.run}"][:, p.sub * row : (p.sub + 1) * row]
            module.register_buffer(f"{prefix}_{name}_weight_{m}", weight.contiguous())
            if name == "first":
                module.register_buffer(f"{prefix}_first_bias_{m}", lin._buffers[f"bias_{p.run}"])
    return plans


def frozen_rows_out(plan: list[RowPlan], prefix: str, buffers: dict, x: torch.Tensor, rows: torch.Tensor) -> None:
    """:func:`~eqvit.nn.slabs.apply_rows_out` with the weights :func:`register_rows_out` registered."""
    weights = [(buffers[f"{prefix}_weight_{m}"], buffers[f"{prefix}_bias_{m}"]) for m in range(len(plan))]
    apply_rows_out(plan, weights, x, rows)


def frozen_rows_in(plans: tuple, prefix: str, buffers: dict, rows: torch.Tensor, out: torch.Tensor) -> None:
    """:func:`~eqvit.nn.slabs.apply_rows_in` with the weights :func:`register_rows_in` registered."""
    first, rest = plans
    weights = (
        [(buffers[f"{prefix}_first_weight_{m}"], buffers[f"{prefix}_first_bias_{m}"]) for m in range(len(first))],
        [buffers[f"{prefix}_rest_weight_{m}"] for m in range(len(rest))],
    )
    apply_rows_in(plans, weights, rows, out)


# ---------------------------------------------------------------------------------------------------
# the Fourier MLP


def _gelu_(module: FourierSlabMlp, values: torch.Tensor) -> None:
    torch.ops.aten.gelu_(values, approximate=module.act.approximate)


def _pointwise_(module: FourierSlabMlp, values: torch.Tensor) -> None:
    values.copy_(module.act(values))


def fourier_slab_mlp_applies(fc1: nn.Module, act: nn.Module, fc2: nn.Module) -> bool:
    """Whether :class:`FourierSlabMlp` can take these layers: frozen Schur linears around a strided
    Fourier nonlinearity, with no zero slabs."""
    if not (isinstance(fc1, FrozenSchurLinear) and isinstance(fc2, FrozenSchurLinear)):
        return False
    return bool(getattr(act, "strided", False)) and not fc1.zero_runs and not fc2.zero_runs


class FourierSlabMlp(nn.Module):
    """``x [..., dim] -> fc2(FT sigma FT^-1 fc1(x)) [..., dim]`` with fixed weights, the hidden features in
    rows ``H [s, T, n]`` (see the module docstring).

    Args:
        fc1, fc2: :class:`FrozenSchurLinear` into and out of the hidden type.
        act: the strided :class:`~eqvit.nn.activation.FourierActivation` on the hidden type.
        chunk_tokens: tokens per chunk.
    """

    def __init__(self, fc1: nn.Module, act: nn.Module, fc2: nn.Module, chunk_tokens: int = CHUNK_TOKENS) -> None:
        super().__init__()
        if not fourier_slab_mlp_applies(fc1, act, fc2):
            raise ValueError("expected frozen Schur linears around a strided FourierActivation, without zero slabs")
        if chunk_tokens < 1:
            raise ValueError(f"expected chunk_tokens >= 1, got {chunk_tokens}")
        self.in_type, self.out_type = fc1.in_type, fc2.out_type
        self.chunk_tokens = int(chunk_tokens)
        self.num_rows = act.slab_inverse.shape[0]
        self.row_width = n = fc1.out_dim // self.num_rows
        self.register_buffer("to_values", act.slab_inverse.detach().clone().contiguous())
        self.register_buffer("from_values", act.slab_forward.detach().clone().contiguous())
        self.act = act.act
        self._pointwise = _gelu_ if type(act.act) is nn.GELU else _pointwise_
        self.fc1_plan = register_rows_out(self, "fc1", fc1, n)
        self.fc2_plans = register_rows_in(self, "fc2", fc2, n)
        self.out_dim = fc2.out_dim

    def extra_repr(self) -> str:
        hidden = f"hidden {self.num_rows} x {self.row_width}"
        return f"{self.in_type} -> {hidden} -> {self.out_type}, chunk={self.chunk_tokens}"

    def _chunk(self, x: torch.Tensor, hidden: torch.Tensor, values: torch.Tensor, out: torch.Tensor, buffers) -> None:
        """One chunk: ``x [T, dim]`` -> ``out [T, out_dim]``, through ``hidden [s, T, n]`` and ``values [s, T n]``."""
        frozen_rows_out(self.fc1_plan, "fc1", buffers, x, hidden)
        flat = hidden.view(self.num_rows, -1)
        torch.mm(buffers["to_values"], flat, out=values)
        self._pointwise(self, values)
        torch.mm(buffers["from_values"], values, out=flat)
        frozen_rows_in(self.fc2_plans, "fc2", buffers, hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., dim] -> [..., out_dim]``."""
        return run_frozen(self, self._forward, x)

    def _forward(self, x: torch.Tensor, buffers: dict) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        T, step = flat.shape[0], min(self.chunk_tokens, max(flat.shape[0], 1))
        out = flat.new_empty(T, self.out_dim)
        size = self.num_rows * self.row_width
        hidden, values = flat.new_empty(size * step), flat.new_empty(size * step)
        for start in range(0, T, step):
            stop = min(T, start + step)
            count = (stop - start) * size
            self._chunk(
                flat[start:stop],
                hidden[:count].view(self.num_rows, stop - start, self.row_width),
                values[:count].view(self.num_rows, -1),
                out[start:stop],
                buffers,
            )
        return out.view(*lead, self.out_dim)


# ---------------------------------------------------------------------------------------------------
# coupled attention


def _head_order(d: int, heads: int, c: int) -> np.ndarray:
    """Row permutation of one slab from storage order ``(component d, head, copy c)`` to ``(head, d, c)``."""
    return np.arange(d * heads * c).reshape(d, heads, c).transpose(1, 0, 2).reshape(-1)


def schur_coupled_attention_applies(attn: nn.Module) -> bool:
    """An :class:`~eqvit.nn.irrep_attention.IrrepAttention` in the ``components`` layout with coupled
    heads and no rotary scheme, whose q/k/v and projection have no zero slabs."""
    from eqvit.nn.basis import NoRotary

    if not (getattr(attn, "schur", False) and getattr(attn, "_slab_heads", None) is not None):
        return False
    return isinstance(attn.rotary, NoRotary) and all(s >= 0 for s, _ in attn._qkv_terms + attn.proj._terms)


class SchurCoupledAttention(nn.Module):
    """Coupled-head attention on ``components``-layout features with fixed Schur weights,
    ``[B, N, dim] -> [B, N, dim]``.

    q, k and v of a run of slabs are one batched matmul (rows ordered ``(q|k|v, head, component,
    copy)``), all joined by one ``cat`` into ``[T, 3, heads, D]`` (head dimension D: every slab's share of
    the head, slab by slab); one SDPA call; each run of the projection reads its share of the heads' output (one copy)
    and writes its output slabs directly. It is the frozen form of the coupled
    :class:`~eqvit.nn.irrep_attention.IrrepAttention` (``schur_attend`` with ``slab_heads``).
    """

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        if not schur_coupled_attention_applies(attn):
            raise ValueError("expected a components-layout IrrepAttention with coupled heads and no rotary scheme")
        self.in_type = self.out_type = attn.ftype
        _, self.num_heads, self.head_dim = attn._groups[0]
        h = self.num_heads
        slab_heads = list(attn._slab_heads)  # (components d, copies per head c) per slab
        share = [d * c for d, c in slab_heads]  # each slab's share of a head
        head_offsets = _offsets(share)
        mats, biases = attn.schur_qkv()
        sizes = attn.q._in_sizes
        # q/k/v runs: rows of every slab from (3, d, h, c) to (3, h, d, c).
        self.qkv_runs = slab_runs(sizes, attn._qkv_terms, keys=slab_heads)
        self._qkv_heads: list[tuple[int, int]] = []  # (head offset, share) per run
        like = mats[0]
        for k, run in enumerate(self.qkv_runs):
            d, c = slab_heads[run.first]
            order = torch.from_numpy(np.concatenate([q * d * h * c + _head_order(d, h, c) for q in range(3)]))
            weight = _stack(mats, run)[:, order]  # [count, 3 h d c, in]
            bias = _stack_bias(biases, run, like)
            self.register_buffer(f"qkv_weight_{k}", weight.transpose(1, 2).contiguous())
            self.register_buffer(f"qkv_bias_{k}", None if bias is None else bias[:, :, order].contiguous())
            self._qkv_heads.append((head_offsets[run.first], d * c))
        # Projection runs: input columns of every slab from (d, h, c) to (h, d, c).
        proj = attn.proj
        proj_mats, proj_biases = proj.schur_mats(), proj.schur_biases()
        self.proj_runs = slab_runs(proj._in_sizes, proj._terms, keys=[slab_heads[s] for s, _ in proj._terms])
        self._proj_heads: list[tuple[int, int]] = []
        for k, run in enumerate(self.proj_runs):
            d, c = slab_heads[proj._terms[run.first][0]]
            order = torch.from_numpy(_head_order(d, h, c))
            weight = _stack(proj_mats, run)[:, :, order]  # [count, out, h d c]
            self.register_buffer(f"proj_weight_{k}", weight.transpose(1, 2).contiguous())
            self.register_buffer(f"proj_bias_{k}", _stack_bias(proj_biases, run, like))
            self._proj_heads.append((head_offsets[proj._terms[run.first][0]], d * c))
        self.sdpa = ScaledDotProductAttention(0.0, attn.fused)
        self.dim = attn.ftype.dim

    def extra_repr(self) -> str:
        return f"{self.num_heads} coupled heads of {self.head_dim}, runs={[r.count for r in self.qkv_runs]}"

    def forward(self, x: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        """``x [B, N, dim] -> [B, N, dim]`` (no rotary scheme: ``rope`` is not used)."""
        return run_frozen(self, self._forward, x)

    def _forward(self, x: torch.Tensor, buffers: dict) -> torch.Tensor:
        B, N, _ = x.shape
        h, D = self.num_heads, self.head_dim
        flat = x.reshape(B * N, self.dim)
        parts = []  # every slab's share of every head, [T, 3, h, share], slab by slab
        for k, (run, (_, share)) in enumerate(zip(self.qkv_runs, self._qkv_heads)):
            slabs = run_view(flat, run.in_start, run.count, run.in_width)
            bias, weight = buffers[f"qkv_bias_{k}"], buffers[f"qkv_weight_{k}"]
            out = torch.bmm(slabs, weight) if bias is None else torch.baddbmm(bias, slabs, weight)
            parts += out.view(run.count, B * N, 3, h, share).unbind(0)
        # One cat lays the heads out (3-4x faster than a permuted copy of each run's output).
        qkv = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        q, k, v = (qkv[:, i].view(B, N, h, D).transpose(1, 2) for i in range(3))
        heads = self.sdpa(q, k, v).transpose(1, 2).reshape(B * N, h, D)
        out = flat.new_empty(B * N, self.dim)
        for k, (run, (offset, share)) in enumerate(zip(self.proj_runs, self._proj_heads)):
            inputs = heads[..., offset : offset + run.count * share].unflatten(-1, (run.count, share))
            inputs = inputs.permute(2, 0, 1, 3).reshape(run.count, B * N, h * share)  # one copy
            target = run_view(out, run.out_start, run.count, run.out_width)
            matmul_into(target, inputs, buffers[f"proj_weight_{k}"], buffers[f"proj_bias_{k}"])
        return out.view(B, N, self.dim)
