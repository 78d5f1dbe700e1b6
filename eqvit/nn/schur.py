"""Schur slabs: the block-sparse products of equivariant linears in the ``components`` layout.

By Schur's lemma an equivariant map between ``components``-layout features (:mod:`eqvit.nn.irrep_features`)
never mixes irreps: a real-type irrep ``rho`` contributes one ``[C''_rho, C'_rho]`` matrix shared by its
``d_rho`` component *slabs* (contiguous column blocks of the token vector), a complex or quaternionic one a
single ``[d C'', d C']`` matrix on its whole block. A :class:`SlabPlan` says how the input is cut into slabs
and which input slab each output slab reads; every structured linear (:class:`~eqvit.nn.linear.IrrepLinear`,
:class:`~eqvit.nn.regular.GroupConvLinear` in the Fourier basis, and their folded forms) gives its slab
matrices and biases (``slab_weights()``) for one of the three products here, all standard PyTorch ops:

* :func:`apply_slabs`: tokens ``[..., in] -> [..., out]``, one ``F.linear`` per output slab on a column
  view of the input, the outputs joined by one ``cat``: ``sum_rho d_rho C''_rho C'_rho`` multiply-adds;
* :func:`rows_out`: tokens ``[T, in]`` -> *rows* ``[R, T, n]``, row ``r`` holding output coordinates
  ``[r n, (r + 1) n)`` of every token. Copies of one homogeneous space (the hidden features of a Fourier
  MLP, the q/k/v of frames-as-heads attention in the Fourier basis) keep their coefficient index in the
  row, so a change of basis of their orbits is one ``[R, R] @ [R, T n]`` GEMM;
* :func:`rows_in`: rows ``[R, T, n]`` -> tokens ``[T, out]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from itertools import accumulate
from typing import NamedTuple

import torch
import torch.nn.functional as F

from eqvit.nn.irrep_features import FeatureType


class SlabPlan(NamedTuple):
    """The slabs of a Schur linear: input slab widths, and per output slab ``(input slab or -1, width)``
    (-1: no input slab, the output slab is zero)."""

    in_sizes: tuple[int, ...]
    terms: tuple[tuple[int, int], ...]

    @property
    def out_dim(self) -> int:
        return sum(self.out_sizes)

    @property
    def out_sizes(self) -> tuple[int, ...]:
        """Width of every output slab."""
        return tuple(width for _, width in self.terms)

    @property
    def in_offsets(self) -> tuple[int, ...]:
        """Start of every input slab."""
        return _starts(self.in_sizes)

    @property
    def out_offsets(self) -> tuple[int, ...]:
        """Start of every output slab."""
        return _starts(self.out_sizes)


def _starts(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Where each of consecutive blocks of ``sizes`` starts."""
    return (0, *accumulate(sizes))[:-1]


def type_slabs(ftype: FeatureType) -> list[tuple[int, int]]:
    """``(irrep index, width)`` of every slab of a ``components``-layout type: one per component of a
    real-type irrep (``C_rho`` wide), one per block otherwise (``d C_rho``)."""
    if ftype.layout != "components":
        raise ValueError(f"slabs are defined for the 'components' layout, got {ftype}")
    slabs = []
    for i, rho, c, _ in ftype.blocks():
        slabs += [(i, c)] * rho.dim if rho.type == "real" else [(i, c * rho.dim)]
    return slabs


def slab_plan(in_type: FeatureType, out_type: FeatureType) -> SlabPlan:
    """The :class:`SlabPlan` of the equivariant linears ``in_type -> out_type`` (both ``components``): output
    slab ``(rho, a)`` reads input slab ``(rho, a)``, or nothing when ``rho`` is absent from ``in_type``."""
    ins = type_slabs(in_type)
    first: dict[int, int] = {}
    for n, (i, _) in enumerate(ins):
        first.setdefault(i, n)
    terms, seen = [], {}
    for i, width in type_slabs(out_type):
        a = seen.get(i, 0)
        seen[i] = a + 1
        terms.append((first[i] + a if i in first else -1, width))
    return SlabPlan(tuple(w for _, w in ins), tuple(terms))


def cut_slabs(x: torch.Tensor | Sequence[torch.Tensor], plan: SlabPlan) -> Sequence[torch.Tensor]:
    """``x [..., in]`` cut into the plan's input slabs (views; ``x`` already cut passes as it is)."""
    if not isinstance(x, torch.Tensor):
        return x
    return x.split(plan.in_sizes, dim=-1) if len(plan.in_sizes) > 1 else (x,)


def constant_slab(ref: torch.Tensor, lead: tuple[int, ...], width: int, bias: torch.Tensor | None) -> torch.Tensor:
    """An output slab no input slab reaches: its bias (or zero) on every token."""
    return ref.new_zeros(*lead, width) if bias is None else bias.expand(*lead, width)


def slab_outputs(
    x: torch.Tensor | Sequence[torch.Tensor],
    plan: SlabPlan,
    mats: Sequence[torch.Tensor | None],
    biases: Sequence[torch.Tensor | None],
) -> list[torch.Tensor]:
    """The output slabs of :func:`apply_slabs` as a list (``x`` may come already cut into its slabs)."""
    slabs = cut_slabs(x, plan)
    ref = slabs[0]
    return [
        F.linear(slabs[s], w, b) if s >= 0 else constant_slab(ref, ref.shape[:-1], width, b)
        for (s, width), w, b in zip(plan.terms, mats, biases)
    ]


def apply_slabs(
    x: torch.Tensor | Sequence[torch.Tensor],
    plan: SlabPlan,
    mats: Sequence[torch.Tensor | None],
    biases: Sequence[torch.Tensor | None],
) -> torch.Tensor:
    """``x [..., in] -> [..., out]``: output slab ``t`` is ``F.linear(input slab, mats[t], biases[t])``
    (the bias alone where the plan has no input slab), the slabs side by side."""
    outs = slab_outputs(x, plan, mats, biases)
    return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]


def slab_matmul(plan: SlabPlan, mats: Sequence[torch.Tensor | None], other: torch.Tensor) -> torch.Tensor:
    """The Schur linear's matrix times ``other [in, k]`` -> ``[out, k]``: output slab ``t`` is ``mats[t]`` times its
    input slab's rows of ``other`` (zeros where the plan has none), the slabs stacked."""
    rows = other.split(plan.in_sizes) if len(plan.in_sizes) > 1 else (other,)
    parts = [
        w @ rows[s] if s >= 0 else other.new_zeros(width, other.shape[1]) for (s, width), w in zip(plan.terms, mats)
    ]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def slab_rows(start: int, width: int, n: int) -> int:
    """The number of rows of ``n`` coordinates in the slab ``[start, start + width)`` (ValueError unless whole)."""
    if start % n or width % n:
        raise ValueError(f"expected slabs of whole rows of {n} coordinates, got [{start}, {start + width})")
    return width // n


def _row_parts(b: torch.Tensor | None, n: int, count: int) -> Sequence[torch.Tensor | None]:
    return [None] * count if b is None else b.split(n)


def rows_out(
    x: torch.Tensor,
    plan: SlabPlan,
    mats: Sequence[torch.Tensor | None],
    biases: Sequence[torch.Tensor | None],
    n: int,
) -> torch.Tensor:
    """``x [T, in] -> rows [out / n, T, n]``: the linear's output with row ``r`` holding output coordinates
    ``[r n, (r + 1) n)``, each row one ``F.linear`` of its input slab with ``n`` rows of the slab matrix."""
    # split / unbind rather than indexing: their backward is one cat / stack, where every slice's backward
    # would zero-fill a tensor of the whole input's size.
    slabs, rows = cut_slabs(x, plan), []
    for (s, width), start, w, b in zip(plan.terms, plan.out_offsets, mats, biases):
        count = slab_rows(start, width, n)
        if s < 0:
            rows += [constant_slab(x, (len(x),), n, bias) for bias in _row_parts(b, n, count)]
        else:
            rows += [F.linear(slabs[s], part, bias) for part, bias in zip(w.split(n), _row_parts(b, n, count))]
    return torch.stack(rows)


def rows_in(
    rows: torch.Tensor,
    plan: SlabPlan,
    mats: Sequence[torch.Tensor | None],
    biases: Sequence[torch.Tensor | None],
) -> torch.Tensor:
    """``rows [in / n, T, n] -> [T, out]``: the linear applied to features held as rows (:func:`rows_out`);
    an input slab of ``k`` rows is read as ``k`` matmuls, accumulated."""
    n, offsets, outs = rows.shape[-1], plan.in_offsets, []
    row_list = rows.unbind(0)  # backward: one stack (indexing would zero-fill all rows per row read)
    for (s, width), w, b in zip(plan.terms, mats, biases):
        if s < 0:
            outs.append(constant_slab(rows, (rows.shape[1],), width, b))
            continue
        first, count = offsets[s] // n, slab_rows(offsets[s], plan.in_sizes[s], n)
        parts = w.split(n, dim=1)
        y = F.linear(row_list[first], parts[0], b)
        for j in range(1, count):
            y = torch.addmm(y, row_list[first + j], parts[j].T)
        outs.append(y)
    return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]


def distinct_weights(tensors: list[torch.Tensor | None]) -> tuple[list[torch.Tensor], tuple[int, ...]]:
    """The distinct tensors of ``tensors`` and where each entry is among them (-1: None). The slabs of one
    real irrep share its matrix, and ``autograd.Function.apply`` is traced by ``torch.compile`` only when no
    tensor comes twice."""
    distinct: list[torch.Tensor] = []
    index = []
    for t in tensors:
        if t is None:
            index.append(-1)
            continue
        k = next((k for k, u in enumerate(distinct) if u is t), len(distinct))
        if k == len(distinct):
            distinct.append(t)
        index.append(k)
    return distinct, tuple(index)


def weights_at(
    distinct: Sequence[torch.Tensor], index: tuple[int, ...], terms: int
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """The inverse of :func:`distinct_weights` for ``terms`` output slabs: ``(matrices, biases)`` per slab."""
    entries = [distinct[k] if k >= 0 else None for k in index]
    return entries[:terms], entries[terms:]


def join_slabs(slabs: Sequence[torch.Tensor | None], plan: SlabPlan, ref: torch.Tensor) -> torch.Tensor:
    """Per input slab ``[T, size]`` (None: zeros, a slab no output reads) -> side by side ``[T, in]``, as ``ref``."""
    parts = [ref.new_zeros(len(ref), size) if p is None else p for p, size in zip(slabs, plan.in_sizes)]
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def accumulate_grad(grads: list[torch.Tensor | None], k: int, value: torch.Tensor) -> None:
    """``grads[k] += value``, the first value taken as it is (a weight shared by several slabs sums their terms)."""
    grads[k] = value if grads[k] is None else grads[k] + value


def slab_linear_grads(
    grad: torch.Tensor,
    plan: SlabPlan,
    index: tuple[int, ...],
    weights: Sequence[torch.Tensor],
    needed: Sequence[bool],
    pieces: Sequence[Sequence[torch.Tensor]],
    out: Sequence[Sequence[torch.Tensor]] | None = None,
) -> tuple[list[torch.Tensor | None], dict[int, list[torch.Tensor]]]:
    """The backward of a Schur linear for autograd Functions that rebuild its input: ``grad [T, out]`` ->
    ``(gradients of the distinct weights, {input slab: gradients of its pieces})``.

    ``weights`` and ``index`` are :func:`distinct_weights` of the slab matrices then biases; ``needed`` says
    which weights need a gradient; ``pieces[s]`` is input slab ``s`` as side-by-side pieces ``[T, k]`` (the
    slab's matrix is split by columns alike): rows of a row layout, or the whole slab. With ``out`` (tensors
    shaped like ``pieces``, e.g. the rows of one buffer) the pieces' gradients are written there, sparing the
    caller a copy into its layout (a slab no output reads gets zeros)."""
    terms = len(plan.terms)
    grad_weights: list[torch.Tensor | None] = [None] * len(weights)
    grad_pieces: dict[int, list[torch.Tensor]] = {}
    for t, ((s, width), start) in enumerate(zip(plan.terms, plan.out_offsets)):
        g = grad[:, start : start + width]
        m, b = index[t], index[terms + t]
        if b >= 0 and needed[b]:
            accumulate_grad(grad_weights, b, g.sum(0))
        if s < 0:
            continue
        inputs = pieces[s]
        cols = weights[m].split([p.shape[-1] for p in inputs], dim=1)
        if needed[m]:
            value = torch.cat([g.T @ p for p in inputs], dim=1) if len(inputs) > 1 else g.T @ inputs[0]
            accumulate_grad(grad_weights, m, value)
        if out is None:
            grads = [g @ c for c in cols]
            grad_pieces[s] = grads if s not in grad_pieces else [a + u for a, u in zip(grad_pieces[s], grads)]
        else:  # out= skips autocast: the operands in the buffer's dtype, as autocast would cast them
            first, dtype = s not in grad_pieces, out[s][0].dtype
            g_cast = g.to(dtype)
            for target, c in zip(out[s], cols):
                torch.mm(g_cast, c.to(dtype), out=target) if first else target.addmm_(g_cast, c.to(dtype))
            grad_pieces[s] = list(out[s])
    if out is not None:
        for s in set(range(len(out))) - set(grad_pieces):  # slabs no output reads
            for target in out[s]:
                target.zero_()
    return grad_weights, grad_pieces


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force on ``device_type``, or None (off, or a device without autocast: meta)."""
    on = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
    return torch.get_autocast_dtype(device_type) if on else None


def autocast_as(device_type: str, dtype: torch.dtype | None) -> AbstractContextManager:
    """Autocast to ``dtype`` (None: no autocast): a Function's backward restoring its forward's state, as
    ``torch.amp.custom_bwd`` does for one device type."""
    return nullcontext() if dtype is None else torch.autocast(device_type, dtype=dtype)
