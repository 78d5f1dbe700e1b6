"""The Fourier MLP with its hidden features as coefficient rows, and its memory-lean training form.

``fc2(FT sigma(FT^-1 fc1(x)))`` with Schur linears around a strided :class:`~eqvit.nn.activation.FourierActivation`
(the hidden MLP of the O(2) models and of the Platonic models in the Fourier basis). The hidden features are
held as *rows* ``[s, T, n]`` (:func:`~eqvit.nn.schur.rows_out`), so each change of basis is one ``[s, s]`` GEMM.

Under autograd the plain chain keeps two hidden-sized tensors per block for backward: the pre-activation values
(for ``sigma'``) and the activated coefficients (for ``fc2``'s weight gradient), a quarter of a ViT's
activation memory each. :func:`rows_mlp_lean` keeps only the pre-activation values, and recomputes ``sigma``
and the transform back in backward: elementwise work and one thin GEMM, against ``fc2``'s GEMM that
recomputing the whole tail (activation checkpointing) would repeat. Its backward is memory-bound work on
hidden-sized tensors, so it runs sigma (or sigma') and the thin transform a block of columns at a time, and
writes the rows' gradients into one buffer instead of stacking them. The forward stays one op per step, so
that ``torch.export`` keeps the batch size free.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from eqvit.nn.schur import (
    SlabPlan,
    autocast_as,
    autocast_dtype,
    distinct_weights,
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


def rows_mlp_applies(fc1: nn.Module, act: nn.Module, fc2: nn.Module) -> bool:
    """Whether :func:`rows_mlp` takes these layers: Schur linears (``plan`` and ``slab_weights``) around a
    strided :class:`FourierActivation` whose hidden slabs are whole coefficient rows."""
    if not (hasattr(fc1, "plan") and hasattr(fc2, "plan") and getattr(act, "strided", False)):
        return False
    n = act.in_type.dim // act.slab_inverse.shape[0]
    out_starts, start = [], 0
    for _, width in fc1.plan.terms:
        out_starts.append((start, width))
        start += width
    in_slabs = zip(fc2.plan.in_offsets, fc2.plan.in_sizes)
    return all(a % n == 0 and w % n == 0 for a, w in [*out_starts, *in_slabs])


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
    (:func:`transformed_rows_in`). Needs ``activation_kind(act.act)``. ``x [..., in] -> [..., out]``."""
    values, n = _pre_activation(fc1, act, x)
    y = transformed_rows_in(values, act.slab_forward, fc2, n, activation_kind(act.act))
    return y.view(*x.shape[:-1], fc2.plan.out_dim)


def _pre_activation(fc1: nn.Module, act: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x [..., in]`` -> (the hidden features' values on the orbits before sigma ``[s, T n]``, the row width
    ``n``): ``fc1`` into coefficient rows ``[s, T, n]``, then one ``[s, s]`` GEMM (a constant matrix: autograd
    keeps nothing of the rows' size for it)."""
    to_values = act.slab_inverse
    n = act.in_type.dim // to_values.shape[0]
    rows = rows_out(x.reshape(-1, x.shape[-1]), fc1.plan, *fc1.slab_weights(), n)
    return torch.mm(to_values, rows.flatten(1)), n


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
    transform = transform.to(values.dtype)  # out= skips autocast: cast as autocast would
    for cols in _column_blocks(values.shape[1]):
        torch.mm(transform, act(values[:, cols]), out=rows[:, cols])
    return rows.view(values.shape[0], -1, n)


def _activation_grad_blocked(grad_rows: torch.Tensor, transform: torch.Tensor, values: torch.Tensor, kind: str):
    """``sigma'(values) * (transform.T @ grad_rows)`` ``[s, T n]``, a block of columns at a time."""
    grad_of, grad_values = _ACTIVATIONS[kind][1], torch.empty_like(values)
    for cols in _column_blocks(values.shape[1]):
        grad_values[:, cols] = grad_of(torch.mm(transform.T, grad_rows[:, cols]), values[:, cols])
    return grad_values


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
            offsets = plan.in_offsets
            firsts = [offset // n for offset in offsets]
            counts = [slab_rows(o, size, n) for o, size in zip(offsets, plan.in_sizes)]
            rows = [hidden[a : a + k] for a, k in zip(firsts, counts)]
            outs = [grad_hidden[a : a + k].unbind(0) for a, k in zip(firsts, counts)]
            needed = ctx.needs_input_grad[6:]
            grad_weights, _ = slab_linear_grads(grad, plan, ctx.index, weights, needed, rows, out=outs)
            # free them before the hidden-sized work below (peak memory); not `del`: torch.compile refuses it here
            hidden = rows = outs = None
            grad_values = _activation_grad_blocked(grad_hidden.flatten(1), transform, values, ctx.kind)
        return (grad_values, None, None, None, None, None, *grad_weights)
