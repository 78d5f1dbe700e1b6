"""Schur slabs as batched matmuls: the plans the training and the inference forms share.

A Schur linear (:class:`~eqvit.nn.linear.IrrepLinear` with ``components`` types) is one small matmul per
output slab: a real-type irrep contributes one slab per component (the components share the matrix),
a complex or quaternionic one a single slab. Consecutive slabs of equal shape, e.g. the four 1-d irreps
of D4 or the two components of its E irrep, sit at equal spacing in the token vector, so a *run* of
them is one ``bmm`` on strided views (:func:`slab_runs`, :func:`run_view`), written straight into the
output's column slabs: no ``split`` and no ``cat``.

Hidden features of ``n`` copies of one homogeneous space (the Fourier MLP) and the q/k/v of the
Fourier-basis Platonic attention live in *rows* ``[R, T, n]``: row ``r`` holds coefficient ``r`` of every
copy for every token, so a Fourier transform is one ``[R, R] @ [R, T n]`` GEMM. :func:`row_plan_out` and
:func:`row_plan_in` say which batched matmuls write a linear's output slabs as rows and read its input
slabs from rows (a slab ``k`` rows wide is ``k`` matmuls of one row each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


class SlabRun(NamedTuple):
    """``count`` consecutive Schur output slabs of equal shape, read from consecutive input slabs.

    Output slab ``first + j`` is ``F.linear(x[..., in_start + j in_width : ...], W_j, b_j)``, written
    at ``out_start + j out_width``; ``in_width == 0`` marks slabs with no input (zeros).
    """

    first: int
    count: int
    in_start: int
    in_width: int
    out_start: int
    out_width: int


def _offsets(sizes: Sequence[int]) -> list[int]:
    out = [0]
    for size in sizes:
        out.append(out[-1] + int(size))
    return out


def slab_runs(sizes: Sequence[int], terms: Sequence[tuple[int, int]], keys: Sequence | None = None) -> list[SlabRun]:
    """Group the Schur plan ``terms`` (``(input slab or -1, output width)`` per output slab, the input
    cut into ``sizes``) into runs of consecutive slabs with equal shapes (and equal ``keys``, if given)."""
    in_offsets, runs, out_start = _offsets(sizes), [], 0
    for t, (s, width) in enumerate(terms):
        in_width = int(sizes[s]) if s >= 0 else 0
        in_start = in_offsets[s] if s >= 0 else 0
        last = runs[-1] if runs else None
        joins = (
            last is not None
            and last.in_width == in_width
            and last.out_width == width
            and (in_width == 0 or terms[t - 1][0] == s - 1)
            and (keys is None or keys[t] == keys[t - 1])
        )
        if joins:
            runs[-1] = last._replace(count=last.count + 1)
        else:
            runs.append(SlabRun(t, 1, in_start, in_width, out_start, int(width)))
        out_start += int(width)
    return runs


def run_view(x: torch.Tensor, start: int, count: int, width: int) -> torch.Tensor:
    """``x [T, dim] -> [count, T, width]``: the ``count`` column slabs from ``start``, as one strided view."""
    row, col = x.stride()
    return x.as_strided((count, x.shape[0], width), (width * col, row, col), x.storage_offset() + start * col)


def stack_run(mats: Sequence[torch.Tensor], run: SlabRun) -> torch.Tensor:
    """The run's slab matrices ``[count, out_width, in_width]``."""
    return torch.stack([mats[t] for t in range(run.first, run.first + run.count)])


def stack_run_bias(biases: Sequence[torch.Tensor | None], run: SlabRun, like: torch.Tensor) -> torch.Tensor | None:
    """``[count, 1, out_width]`` (zeros for slabs without a bias), or None when no slab has one."""
    parts = [biases[t] for t in range(run.first, run.first + run.count)]
    if all(b is None for b in parts):
        return None
    return torch.stack([like.new_zeros(run.out_width) if b is None else b for b in parts])[:, None]


def matmul_into(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``out = x @ weight (+ bias)`` batched, writing into the (strided) view ``out``."""
    if bias is None:
        torch.bmm(x, weight, out=out)
    else:
        torch.baddbmm(bias, x, weight, out=out)


def accumulate_into(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """``out += x @ weight`` batched, in the (strided) view ``out`` (the ``out=`` form of ``baddbmm``:
    ``FlopCounterMode`` counts it, unlike ``Tensor.baddbmm_``)."""
    torch.baddbmm(out, x, weight, out=out)


class RowPlan(NamedTuple):
    """One batched matmul between token-major features ``[T, dim]`` and rows ``[R, T, row]``: the ``count``
    slabs of ``width`` from column ``start`` on one side, the rows ``first_row + i * step`` (``i < count``) on
    the other; the weights are sub-row ``sub`` (of ``step``) of run ``run``."""

    count: int
    start: int
    width: int
    first_row: int
    step: int
    run: int
    sub: int


def slab_rows(start: int, width: int, row: int) -> int:
    """Rows of width ``row`` in the slab ``[start, start + width)``; ValueError unless it is whole rows."""
    if start % row or width % row:
        raise ValueError(f"expected slabs of whole rows of {row} coordinates, got [{start}, {start + width})")
    return width // row


def row_plan_out(runs: Sequence[SlabRun], row: int) -> list[RowPlan]:
    """Write the runs' output slabs as rows of width ``row``: per run and sub-row ``j`` the input slabs times
    output columns ``[j row, (j + 1) row)`` of each slab's matrix."""
    plan = []
    for n, run in enumerate(runs):
        k = slab_rows(run.out_start, run.out_width, row)
        plan += [RowPlan(run.count, run.in_start, run.in_width, run.out_start // row + j, k, n, j) for j in range(k)]
    return plan


def row_plan_in(runs: Sequence[SlabRun], row: int) -> tuple[list[RowPlan], list[RowPlan]]:
    """Read the runs' input slabs from rows of width ``row``: ``(first, rest)``, sub-row 0 of every slab
    writes the output slabs (with the bias), the others accumulate (input columns ``[j row, (j + 1) row)``)."""
    first, rest = [], []
    for n, run in enumerate(runs):
        k = slab_rows(run.in_start, run.in_width, row)
        for j in range(k):
            (first if j == 0 else rest).append(
                RowPlan(run.count, run.out_start, run.out_width, run.in_start // row + j, k, n, j)
            )
    return first, rest


def rows_of(rows: torch.Tensor, p: RowPlan) -> torch.Tensor:
    """The plan's rows ``[count, T, row]`` of ``rows [R, T, row]`` (a strided view)."""
    return rows[p.first_row : p.first_row + p.count * p.step : p.step]


def apply_rows_out(plan: Sequence[RowPlan], weights: Sequence, x: torch.Tensor, rows: torch.Tensor) -> None:
    """``x [T, in]`` -> the rows ``[R, T, row]``; ``weights[m] = (W [count, width, row], bias or None)``."""
    for p, (weight, bias) in zip(plan, weights):
        matmul_into(rows_of(rows, p), run_view(x, p.start, p.count, p.width), weight, bias)


def apply_rows_in(
    plans: tuple[Sequence[RowPlan], Sequence[RowPlan]],
    weights: tuple[Sequence, Sequence],
    rows: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """The rows ``[R, T, row]`` -> ``out [T, out]``; ``weights = (first, rest)``: ``(W [count, row, width],
    bias or None)`` per first entry, ``W`` per accumulating one."""
    (first, rest), (first_weights, rest_weights) = plans, weights
    for p, (weight, bias) in zip(first, first_weights):
        matmul_into(run_view(out, p.start, p.count, p.width), rows_of(rows, p), weight, bias)
    for p, weight in zip(rest, rest_weights):
        accumulate_into(run_view(out, p.start, p.count, p.width), rows_of(rows, p), weight)
