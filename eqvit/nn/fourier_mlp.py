"""The training form of the Schur Fourier MLP, on coefficient rows, with its own backward.

``fc2 o FT sigma FT^-1 o fc1`` with ``components``-layout (Schur) linears and a strided Fourier
nonlinearity (:class:`~eqvit.nn.activation.FourierActivation` with a GELU): the hidden features are kept
as coefficient rows ``[s, T, n]`` (:mod:`eqvit.nn.slabs`), so the transform and its inverse are one
``[s, s] @ [s, T n]`` GEMM each instead of a batched 8 x 8 matmul per token, and the linears are batched
matmuls on runs of equal slabs that write into and read from the rows directly.

As one ``autograd.Function`` it also keeps less for backward: the MLP's input and the values on X
(the GELU's input), one hidden-sized tensor where autograd would keep two (the GELU's input and fc2's
input, which backward recomputes from the values: a GELU and one GEMM). The gradients are the same
(tests check them against autograd in float64).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from eqvit.nn.slabs import (
    RowPlan,
    SlabRun,
    accumulate_into,
    apply_rows_in,
    apply_rows_out,
    row_plan_in,
    row_plan_out,
    rows_of,
    run_view,
    slab_runs,
    stack_run,
    stack_run_bias,
)


class MlpPlan(NamedTuple):
    """The fixed shape of a Schur Fourier MLP: runs and row plans of both linears, the rows ``[rows, T, width]``."""

    runs1: list[SlabRun]
    out1: list[RowPlan]
    runs2: list[SlabRun]
    in2: tuple[list[RowPlan], list[RowPlan]]
    rows: int
    width: int
    in_dim: int
    out_dim: int
    approximate: str


def mlp_plan(fc1: nn.Module, act: nn.Module, fc2: nn.Module) -> MlpPlan | None:
    """The plan of ``fc2(act(fc1(x)))``, or None when it does not apply: both linears Schur without zero
    slabs, a strided activation with a GELU, every hidden slab made of whole rows."""
    if not (getattr(fc1, "schur", False) and getattr(fc2, "schur", False)):
        return None
    if not (getattr(act, "strided", False) and type(act.act) is nn.GELU):
        return None
    if any(s < 0 for s, _ in fc1._terms) or any(s < 0 for s, _ in fc2._terms):
        return None
    runs1, runs2 = slab_runs(fc1._in_sizes, fc1._terms), slab_runs(fc2._in_sizes, fc2._terms)
    rows = act.slab_inverse.shape[0]
    width = act.ftype.dim // rows
    try:
        out1, in2 = row_plan_out(runs1, width), row_plan_in(runs2, width)
    except ValueError:
        return None
    return MlpPlan(runs1, out1, runs2, in2, rows, width, fc1.in_type.dim, fc2.out_type.dim, act.act.approximate)


def _stacks(plan_runs: list[SlabRun], mats: list, biases: list, like: torch.Tensor):
    weights = [stack_run(mats, run).transpose(1, 2) for run in plan_runs]  # [count, in, out]
    bias = [stack_run_bias(biases, run, like) for run in plan_runs]  # [count, 1, out] or None
    return weights, bias


def _cols(t: torch.Tensor | None, p: RowPlan, width: int) -> torch.Tensor | None:
    return None if t is None else t[..., p.sub * width : (p.sub + 1) * width]


class _SchurFourierMlp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, plan: MlpPlan, to_values, from_values, n1: int, n2: int, *tensors):
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        ctx.dtypes = [None if t is None else t.dtype for t in tensors]
        ctx.x_dtype, ctx.counts = x.dtype, (n1, n2)
        tensors = [None if t is None else t.to(dtype) for t in tensors]
        x, to_values, from_values = x.to(dtype), to_values.to(dtype), from_values.to(dtype)
        mats1, biases1, mats2, biases2 = (
            tensors[:n1],
            tensors[n1 : 2 * n1],
            tensors[2 * n1 : 2 * n1 + n2],
            tensors[2 * n1 + n2 :],
        )
        with torch.autocast(device, enabled=False):
            w1, b1 = _stacks(plan.runs1, mats1, biases1, x)
            w2, b2 = _stacks(plan.runs2, mats2, biases2, x)
            n, T = plan.width, x.shape[0]
            rows = x.new_empty(plan.rows, T, n)
            apply_rows_out(plan.out1, [(_cols(w1[p.run], p, n), _cols(b1[p.run], p, n)) for p in plan.out1], x, rows)
            values = torch.mm(to_values, rows.view(plan.rows, -1))
            torch.mm(from_values, F.gelu(values, approximate=plan.approximate), out=rows.view(plan.rows, -1))
            out = x.new_empty(T, plan.out_dim)
            first, rest = plan.in2
            weights = (
                [(w2[p.run][:, p.sub * n : (p.sub + 1) * n], b2[p.run]) for p in first],
                [w2[p.run][:, p.sub * n : (p.sub + 1) * n] for p in rest],
            )
            apply_rows_in(plan.in2, weights, rows, out)
        ctx.plan = plan
        ctx.has_bias = [b is not None for b in biases1], [b is not None for b in biases2]
        ctx.save_for_backward(x, values, to_values, from_values, *mats1, *mats2)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        plan, (n1, n2) = ctx.plan, ctx.counts
        x, values, to_values, from_values, *mats = ctx.saved_tensors
        mats1, mats2 = mats[:n1], mats[n1:]
        grad = grad.to(x.dtype)
        n, T, R = plan.width, x.shape[0], plan.rows
        w1, _ = _stacks(plan.runs1, mats1, [None] * n1, x)
        w2, _ = _stacks(plan.runs2, mats2, [None] * n2, x)
        hidden = torch.mm(from_values, F.gelu(values, approximate=plan.approximate)).view(R, T, n)  # fc2's input
        # fc2: weight blocks [count, n, out] per (run, sub-row), the input gradient into rows.
        d_hidden = x.new_empty(R, T, n)
        d_w2 = [[None] * (run.in_width // n) for run in plan.runs2]
        d_b2 = [None] * len(plan.runs2)
        for p in plan.in2[0] + plan.in2[1]:
            g = run_view(grad, p.start, p.count, p.width)  # [count, T, out]
            d_w2[p.run][p.sub] = torch.bmm(rows_of(hidden, p).transpose(1, 2), g)
            weight = w2[p.run][:, p.sub * n : (p.sub + 1) * n]
            torch.bmm(g, weight.transpose(1, 2), out=rows_of(d_hidden, p))
            if p.sub == 0:
                d_b2[p.run] = g.sum(1)
        d_values = torch.ops.aten.gelu_backward(
            torch.mm(from_values.T, d_hidden.view(R, -1)), values, approximate=plan.approximate
        )
        d_rows = torch.mm(to_values.T, d_values).view(R, T, n)
        # fc1: weight blocks [count, in, n] per (run, sub-row), the input gradient accumulated per slab.
        d_x = torch.zeros_like(x)
        d_w1 = [[None] * (run.out_width // n) for run in plan.runs1]
        d_b1 = [[None] * (run.out_width // n) for run in plan.runs1]
        for p in plan.out1:
            h = rows_of(d_rows, p)  # [count, T, n]
            inputs = run_view(x, p.start, p.count, p.width)
            d_w1[p.run][p.sub] = torch.bmm(inputs.transpose(1, 2), h)
            d_b1[p.run][p.sub] = h.sum(1)
            weight = w1[p.run][:, :, p.sub * n : (p.sub + 1) * n].transpose(1, 2)
            accumulate_into(run_view(d_x, p.start, p.count, p.width), h, weight)
        grads1 = _per_term(
            plan.runs1, [torch.cat(blocks, dim=2) for blocks in d_w1], [torch.cat(b, dim=1) for b in d_b1]
        )
        grads2 = _per_term(plan.runs2, [torch.cat(blocks, dim=1) for blocks in d_w2], d_b2)
        (mats_1, bias_1), (mats_2, bias_2) = grads1, grads2
        has1, has2 = ctx.has_bias
        bias_1 = [b if has else None for b, has in zip(bias_1, has1)]
        bias_2 = [b if has else None for b, has in zip(bias_2, has2)]
        out = [*mats_1, *bias_1, *mats_2, *bias_2]
        out = [None if g is None else g.to(dtype) for g, dtype in zip(out, ctx.dtypes)]
        return (d_x.to(ctx.x_dtype), None, None, None, None, None, *out)


def _per_term(runs: list[SlabRun], d_weights: list, d_biases: list) -> tuple[list, list]:
    """Run gradients ``[count, in, out]`` / ``[count, out]`` -> per output slab ``[out, in]`` / ``[out]``."""
    mats, biases = [], []
    for run, d_w, d_b in zip(runs, d_weights, d_biases):
        for i in range(run.count):
            mats.append(d_w[i].T)
            biases.append(d_b[i])
    return mats, biases


def schur_fourier_mlp(plan: MlpPlan, fc1: nn.Module, act: nn.Module, fc2: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``fc2(act(fc1(x)))`` on coefficient rows (see the module docstring), ``x [..., dim] -> [..., dim]``."""
    mats1, biases1 = fc1.schur_mats(), fc1.schur_biases()
    mats2, biases2 = fc2.schur_mats(), fc2.schur_biases()
    buffers = act._buffers
    lead = x.shape[:-1]
    out = _SchurFourierMlp.apply(
        x.reshape(-1, x.shape[-1]), plan, buffers["slab_inverse"], buffers["slab_forward"], len(mats1), len(mats2),
        *mats1, *biases1, *mats2, *biases2,
    )  # fmt: skip
    return out.view(*lead, plan.out_dim)
