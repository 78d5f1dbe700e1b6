"""The Fourier MLP with its hidden features as coefficient rows, and its memory-lean training form.

``fc2(FT sigma(FT^-1 fc1(x)))`` with Schur linears around a strided :class:`~eqvit.nn.activation.FourierActivation`
(the hidden MLP of the O(2) models and of the Platonic models in the Fourier basis). The hidden features are
held as *rows* ``[s, T, n]`` (:func:`~eqvit.nn.schur.rows_out`), so each change of basis is one ``[s, s]`` GEMM.

Under autograd the plain chain keeps two hidden-sized tensors per block for backward: the pre-activation values
(for ``sigma'``) and the activated coefficients (for ``fc2``'s weight gradient), a quarter of a ViT's
activation memory each. :func:`rows_mlp_lean` keeps only the pre-activation values, and recomputes ``sigma``
and the transform back in backward: elementwise work and one thin GEMM, against ``fc2``'s GEMM that
recomputing the whole tail (activation checkpointing) would repeat. Around its GEMMs the MLP is memory-bound
work on hidden-sized tensors, so both passes hold the hidden rows transposed, ``[s, n, T]``, in one buffer:
each linear is one GEMM per slab on a block of whole rows, and sigma (or sigma') with the thin transforms runs
a block of coordinates at a time, in cache (blocks over the coordinates, which the layer fixes, so that
``torch.export`` keeps the number of tokens free).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from eqvit.nn.schur import (
    SlabPlan,
    accumulate_grad,
    autocast_as,
    autocast_dtype,
    constant_slab,
    cut_slabs,
    distinct_weights,
    join_slabs,
    rows_in,
    rows_out,
    slab_linear_grads,
    slab_rows,
    weights_at,
)

__all__ = ["activation_kind", "rows_mlp", "rows_mlp_applies", "rows_mlp_lean", "transformed_rows_in"]

# sigma and its derivative (``grad, pre-activation -> grad of the pre-activation``), by name.
_ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "identity": (lambda v: v, lambda g, v: g),
    "gelu": (F.gelu, lambda g, v: torch.ops.aten.gelu_backward(g, v)),
    "gelu_tanh": (
        lambda v: F.gelu(v, approximate="tanh"),
        lambda g, v: torch.ops.aten.gelu_backward(g, v, approximate="tanh"),
    ),
    "silu": (F.silu, lambda g, v: torch.ops.aten.silu_backward(g, v)),
    "relu": (F.relu, lambda g, v: g * (v > 0)),
}


def activation_kind(act: nn.Module) -> str | None:
    """The name under which :func:`rows_mlp_lean` knows ``act``'s derivative, or None (unknown: the chain)."""
    if isinstance(act, nn.GELU):
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    if isinstance(act, nn.SiLU):
        return "silu"
    if isinstance(act, nn.ReLU):
        return "relu"
    return None


def _row_width(act: nn.Module) -> int:
    """The coordinates per hidden row of a strided :class:`FourierActivation`: its width over its orbit size."""
    return act.in_type.dim // act.slab_inverse.shape[0]


def rows_mlp_applies(fc1: nn.Module, act: nn.Module, fc2: nn.Module) -> bool:
    """Whether :func:`rows_mlp` takes these layers: Schur linears (``plan`` and ``slab_weights``) around a
    strided :class:`FourierActivation` whose hidden slabs are whole coefficient rows."""
    if not (hasattr(fc1, "plan") and hasattr(fc2, "plan") and getattr(act, "strided", False)):
        return False
    n = _row_width(act)
    out_slabs = zip(fc1.plan.out_offsets, fc1.plan.out_sizes)
    in_slabs = zip(fc2.plan.in_offsets, fc2.plan.in_sizes)
    return all(a % n == 0 and w % n == 0 for a, w in [*out_slabs, *in_slabs])


def rows_mlp(
    fc1: nn.Module, act: nn.Module, fc2: nn.Module, x: torch.Tensor, hidden_drop: nn.Module | None = None
) -> torch.Tensor:
    """``fc2(FT drop(sigma(FT^-1 fc1(x))))`` with the hidden features as coefficient rows ``[s, T, n]``
    (:func:`~eqvit.nn.schur.rows_out`): the transform to the values on the orbits and back is one
    ``[s, s] @ [s, T n]`` GEMM each way, not a small matmul per token. ``hidden_drop`` (a dropout, or None)
    acts on the values, where a plain MLP drops its hidden activations. ``x [..., in] -> [..., out]``."""
    values, n = _pre_activation(fc1, act, x)
    values = act.act(values)  # sigma on the orbits' points
    if hidden_drop is not None:  # an argument of the call, fixed by each caller's construction
        values = hidden_drop(values)
    rows = torch.mm(act.slab_forward, values).view(len(values), -1, n)
    return rows_in(rows, fc2.plan, *fc2.slab_weights()).view(*x.shape[:-1], fc2.plan.out_dim)


def rows_mlp_lean(fc1: nn.Module, act: nn.Module, fc2: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """:func:`rows_mlp` without hidden dropout, keeping one hidden-sized tensor for backward instead of two
    (:class:`_LeanRowsMlp`). Needs ``activation_kind(act.act)``. ``x [..., in] -> [..., out]``."""
    n = _row_width(act)
    (mats1, biases1), (mats2, biases2) = fc1.slab_weights(), fc2.slab_weights()
    weights1, index1 = distinct_weights([*mats1, *biases1])
    weights2, index2 = distinct_weights([*mats2, *biases2])
    y = _LeanRowsMlp.apply(
        x.reshape(-1, x.shape[-1]),
        act.slab_inverse,
        act.slab_forward,
        activation_kind(act.act),
        (fc1.plan, index1, fc2.plan, index2, n, len(weights1)),
        *weights1,
        *weights2,
    )
    return y.view(*x.shape[:-1], fc2.plan.out_dim)


def _pre_activation(fc1: nn.Module, act: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x [..., in]`` -> (the hidden features' values on the orbits before sigma ``[s, T n]``, the row width
    ``n``): ``fc1`` into coefficient rows ``[s, T, n]``, then one ``[s, s]`` GEMM (a constant matrix: autograd
    keeps nothing of the rows' size for it)."""
    n = _row_width(act)
    rows = rows_out(x.reshape(-1, x.shape[-1]), fc1.plan, *fc1.slab_weights(), n)
    return torch.mm(act.slab_inverse, rows.flatten(1)), n


def transformed_rows_in(
    values: torch.Tensor, transform: torch.Tensor, linear: nn.Module, n: int, kind: str = "identity"
) -> torch.Tensor:
    """``rows_in(transform @ sigma(values))``: values ``[s, T n]`` -> ``[T, out]``, through a fixed ``[s, s]``
    change of basis, ``sigma`` named by ``kind`` (:func:`activation_kind`, or ``"identity"``) and the Schur
    linear ``linear`` reading rows of ``n``. Keeps ``values`` alone for backward (a tensor that the caller
    often keeps anyway: SDPA's output), recomputing the rest (:class:`_TransformedRowsIn`)."""
    mats, biases = linear.slab_weights()
    weights, index = distinct_weights([*mats, *biases])
    return _TransformedRowsIn.apply(values, transform, kind, linear.plan, n, index, *weights)


def _transformed_rows(values: torch.Tensor, transform: torch.Tensor, kind: str, n: int) -> torch.Tensor:
    """Values ``[s, T n]`` -> rows ``transform @ sigma(values)`` ``[s, T, n]``."""
    return torch.mm(transform, _ACTIVATIONS[kind][0](values)).view(values.shape[0], -1, n)


# Columns per block of the blocked elementwise-and-transform passes in backward: a block of s rows stays in
# cache between sigma (or sigma') and the thin [s, s] GEMM, where the whole tensor would go through memory twice.
_BLOCK_COLUMNS = 1 << 16


def _column_blocks(width: int) -> list[slice]:
    return [slice(start, start + _BLOCK_COLUMNS) for start in range(0, width, _BLOCK_COLUMNS)]


def _transformed_rows_blocked(values: torch.Tensor, transform: torch.Tensor, kind: str, n: int) -> torch.Tensor:
    """:func:`_transformed_rows` a block of columns at a time (no autograd: a Function's backward)."""
    act, rows = _ACTIVATIONS[kind][0], torch.empty_like(values)
    transform = transform.to(values.dtype)  # the values' dtype, as autocast would cast it
    for cols in _column_blocks(values.shape[1]):  # in place: not a strided out=, which torch.compile refuses
        rows[:, cols].addmm_(transform, act(values[:, cols]), beta=0)
    return rows.view(values.shape[0], -1, n)


def _activation_grad_blocked(grad_rows: torch.Tensor, transform: torch.Tensor, values: torch.Tensor, kind: str):
    """``sigma'(values) * (transform.T @ grad_rows)`` ``[s, T n]``, a block of columns at a time."""
    grad_of, grad_values = _ACTIVATIONS[kind][1], torch.empty_like(values)
    for cols in _column_blocks(values.shape[1]):
        grad_values[:, cols] = grad_of(torch.mm(transform.T, grad_rows[:, cols]), values[:, cols])
    return grad_values


def _slab_row_ranges(starts: tuple[int, ...], widths: tuple[int, ...], n: int) -> list[slice]:
    """The rows of ``n`` coordinates that slabs ``[start, start + width)`` occupy (ValueError unless whole)."""
    return [slice(a // n, a // n + slab_rows(a, w, n)) for a, w in zip(starts, widths)]


def _in_rows(plan: SlabPlan, n: int) -> list[slice]:
    """The rows of every input slab of ``plan``."""
    return _slab_row_ranges(plan.in_offsets, plan.in_sizes, n)


def _out_rows(plan: SlabPlan, n: int) -> list[slice]:
    """The rows of every output slab of ``plan``."""
    return _slab_row_ranges(plan.out_offsets, plan.out_sizes, n)


class _TransformedRowsIn(torch.autograd.Function):
    """:func:`transformed_rows_in` with its backward written out: saves the values alone and recomputes the
    transformed rows from them (see the module docstring). The backward runs under the forward's autocast
    state, as ``torch.amp.custom_bwd`` would."""

    @staticmethod
    def forward(ctx, values, transform, kind: str, plan: SlabPlan, n: int, index: tuple[int, ...], *weights):
        # index: per output slab its matrix, then its bias, among the distinct ``weights`` (-1: None)
        mats, biases = weights_at(weights, index, len(plan.terms))
        ctx.amp_dtype = autocast_dtype(values.device.type)
        ctx.kind, ctx.plan, ctx.index, ctx.n = kind, plan, index, n
        ctx.save_for_backward(values, transform, *weights)
        return rows_in(_transformed_rows(values, transform, kind, n), plan, mats, biases)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        values, transform, *weights = ctx.saved_tensors
        plan, n = ctx.plan, ctx.n
        with autocast_as(values.device.type, ctx.amp_dtype):
            hidden = _transformed_rows_blocked(values, transform, ctx.kind, n).unbind(0)
            grad_hidden = torch.empty_like(values).view(len(hidden), -1, n)  # the rows' gradients, written in place
            in_rows = _in_rows(plan, n)
            rows = [hidden[at] for at in in_rows]
            outs = [grad_hidden[at].unbind(0) for at in in_rows]
            needed = ctx.needs_input_grad[6:]
            grad_weights, _ = slab_linear_grads(grad, plan, ctx.index, weights, needed, rows, out=outs)
            # free them before the hidden-sized work below (peak memory); not `del`: torch.compile refuses it here
            hidden = rows = outs = None
            grad_values = _activation_grad_blocked(grad_hidden.flatten(1), transform, values, ctx.kind)
        return (grad_values, None, None, None, None, None, *grad_weights)


# ------------------------------------------------------------------------------------ the lean MLP, whole
# Hidden coordinates per block of the lean MLP's elementwise-and-transform passes. A block is [s, k, T]: over
# the coordinates, which the layer fixes, not over the tokens, whose number torch.export keeps free. 64 keeps a
# block's few tensors in the last-level cache at ViT-S batch 8 (1,576 tokens: 3.2 MB each) with few blocks: the
# MLP's fwd + bwd took 50 ms at 16 and at 64, and torch.compile, which unrolls the loops, 11.2 against 8.0 s.
_BLOCK_COORDINATES = 64


def _coordinate_blocks(n: int) -> list[slice]:
    return [slice(start, start + _BLOCK_COORDINATES) for start in range(0, n, _BLOCK_COORDINATES)]


def _write_rows(x: torch.Tensor, plan: SlabPlan, mats, biases, rows: torch.Tensor) -> None:
    """A Schur linear ``x [T, in]`` into ``rows [s, n, T]`` (row ``r`` = output coordinates ``[r n, (r + 1) n)``,
    transposed): one GEMM per output slab, written in place (a slab's rows are one ``[width, T]`` block)."""
    n, T = rows.shape[1], rows.shape[2]
    slabs = cut_slabs(x, plan)
    for (s, width), at, w, b in zip(plan.terms, _out_rows(plan, n), mats, biases):
        target = rows[at].flatten(0, 1)  # [width, T], contiguous
        if s < 0:
            target.zero_() if b is None else target.copy_(b[:, None].expand(width, T))
        elif b is None:
            torch.mm(w, slabs[s].T, out=target)
        else:
            torch.addmm(b[:, None], w, slabs[s].T, out=target)


def _read_rows(rows: torch.Tensor, plan: SlabPlan, mats, biases) -> torch.Tensor:
    """A Schur linear on features held as ``rows [s, n, T]`` (:func:`_write_rows`) -> ``[T, out]``: one GEMM per
    output slab on its input slab's rows."""
    T, in_rows, outs = rows.shape[2], _in_rows(plan, rows.shape[1]), []
    for (s, width), w, b in zip(plan.terms, mats, biases):
        if s < 0:
            outs.append(constant_slab(rows, (T,), width, b))
            continue
        source = rows[in_rows[s]].flatten(0, 1).T  # [T, in slab]
        outs.append(torch.mm(source, w.T) if b is None else torch.addmm(b, source, w.T))
    return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]


class _LeanRowsMlp(torch.autograd.Function):
    """:func:`rows_mlp_lean`: ``fc2(FT sigma(FT^-1 fc1(x)))`` on tokens ``x [T, in]``, its backward written out.

    The hidden features live in one buffer of rows ``[s, n, T]``: ``fc1`` writes it one GEMM per output slab (no
    stack), and the two changes of basis and ``sigma`` run a block of coordinates at a time, so the block stays in
    cache between them (three passes over a hidden-sized tensor in memory would be slower than the GEMMs around
    them); each transform writes its block of the buffer in place (``addmm_`` with ``beta=0``, which reads nothing
    there), where a product and a copy would pass over it twice. It keeps the pre-activation values alone for
    backward, recomputing the activated rows for ``fc2``'s weight gradient; backward reuses its buffers in place.
    Autocast: the forward computes in the autocast dtype, casting explicitly (``out=`` and in-place ops skip
    autocast), and the backward in the forward's dtype.
    """

    @staticmethod
    def forward(ctx, x, to_values, transform, kind: str, layout: tuple, *weights):
        # layout: (fc1's plan, its weights' index, fc2's plan, its index, row width n, number of fc1's weights);
        # an index gives per output slab its matrix, then its bias, among the distinct weights (-1: None).
        plan1, index1, plan2, index2, n, count1 = layout
        dtype = autocast_dtype(x.device.type) or x.dtype
        cast = [w.to(dtype) for w in weights]
        mats1, biases1 = weights_at(cast[:count1], index1, len(plan1.terms))
        mats2, biases2 = weights_at(cast[count1:], index2, len(plan2.terms))
        to_values, transform, act = to_values.to(dtype), transform.to(dtype), _ACTIVATIONS[kind][0]
        rows = x.new_empty(len(to_values), n, x.shape[0], dtype=dtype)
        _write_rows(x.to(dtype), plan1, mats1, biases1, rows)
        values = []  # per block [s, k T], kept for backward: new tensors (torch.compile takes no strided out=)
        for block in _coordinate_blocks(n):
            coefficients = rows[:, block]
            values.append(torch.mm(to_values, coefficients.flatten(1)))
            coefficients.flatten(1).addmm_(transform, act(values[-1]), beta=0)  # activated, in place
        ctx.kind, ctx.layout = kind, layout
        ctx.save_for_backward(x, to_values, transform, *values, *weights)
        return _read_rows(rows, plan2, mats2, biases2)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        plan1, index1, plan2, index2, n, count1 = ctx.layout
        blocks = _coordinate_blocks(n)
        x, to_values, transform, *saved = ctx.saved_tensors
        values, weights = saved[: len(blocks)], saved[len(blocks) :]
        act, act_grad = _ACTIVATIONS[ctx.kind]
        dtype, T = values[0].dtype, x.shape[0]
        cast = [w.to(dtype) for w in weights]
        needed = ctx.needs_input_grad[5:]
        # one buffer: the activated rows (recomputed), then their gradients, then those of fc1's output rows
        rows = values[0].new_empty(len(to_values), n, T)
        for block, pre in zip(blocks, values):  # in place: not a strided out=, which torch.compile refuses
            rows[:, block].flatten(1).addmm_(transform, act(pre), beta=0)
        grads2 = _read_rows_grads(grad.to(dtype), plan2, index2, cast[count1:], needed[count1:], rows)
        for block, pre in zip(blocks, values):
            g = rows[:, block]
            g.flatten(1).addmm_(to_values.T, act_grad(torch.mm(transform.T, g.flatten(1)), pre), beta=0)
        grads1, grad_x = _write_rows_grads(
            rows, plan1, index1, cast[:count1], needed[:count1], x.to(dtype), ctx.needs_input_grad[0]
        )
        grads = [None if g is None else g.to(w.dtype) for g, w in zip(grads1 + grads2, weights)]
        return (None if grad_x is None else grad_x.to(x.dtype), None, None, None, None, *grads)


def _read_rows_grads(grad, plan: SlabPlan, index, weights, needed, rows) -> list:
    """The backward of :func:`_read_rows`: the gradients of the distinct ``weights`` (:func:`distinct_weights`),
    then the rows' gradients written over ``rows [s, n, T]`` itself (zeros for rows no output reads): the weight
    gradients read every row first, and the buffer is not needed twice."""
    terms, in_rows = len(plan.terms), _in_rows(plan, rows.shape[1])
    grads: list = [None] * len(weights)
    grad_terms = grad.split(plan.out_sizes, dim=1)

    def source(s: int) -> torch.Tensor:  # input slab s's rows as one [in slab, T] block
        return rows[in_rows[s]].flatten(0, 1)

    for t, (s, _) in enumerate(plan.terms):
        m, b = index[t], index[terms + t]
        if b >= 0 and needed[b]:
            accumulate_grad(grads, b, grad_terms[t].sum(0))
        if s >= 0 and needed[m]:
            accumulate_grad(grads, m, torch.mm(grad_terms[t].T, source(s).T))
    written = set()
    for t, (s, _) in enumerate(plan.terms):
        if s < 0:
            continue
        target, g, w = source(s), grad_terms[t], weights[index[t]]
        torch.mm(w.T, g.T, out=target) if s not in written else target.addmm_(w.T, g.T)
        written.add(s)
    for s in set(range(len(plan.in_sizes))) - written:  # slabs no output reads
        source(s).zero_()
    return grads


def _write_rows_grads(grad_rows, plan: SlabPlan, index, weights, needed, x, input_needed: bool):
    """The backward of :func:`_write_rows`: (the gradients of the distinct ``weights``, the input's or None)."""
    terms = len(plan.terms)
    slabs = cut_slabs(x, plan)
    grads: list = [None] * len(weights)
    grad_slabs: list = [None] * len(plan.in_sizes)
    for t, ((s, _), at) in enumerate(zip(plan.terms, _out_rows(plan, grad_rows.shape[1]))):
        g = grad_rows[at].flatten(0, 1)  # [width, T]
        m, b = index[t], index[terms + t]
        if b >= 0 and needed[b]:
            accumulate_grad(grads, b, g.sum(1))
        if s < 0:
            continue
        if needed[m]:
            accumulate_grad(grads, m, torch.mm(g, slabs[s]))
        if input_needed:
            w = weights[m]
            grad_slabs[s] = torch.mm(g.T, w) if grad_slabs[s] is None else grad_slabs[s].addmm_(g.T, w)
    if not input_needed:
        return grads, None
    return grads, join_slabs(grad_slabs, plan, x)
