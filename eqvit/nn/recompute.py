"""Recompute-in-backward for cheap elementwise layers (the irrep-wise LayerNorm).

Autograd would keep the intermediates of such a layer (for the norm: the centred token ``z`` and
``gamma z``, twice the width of its input per token) for ops that cost little to run again.
:func:`recompute` keeps the inputs only and runs the function a second time inside ``backward``,
as ``torch.utils.checkpoint`` does, but as one ``autograd.Function``: under ``no_grad`` it is a
plain call (checkpoint's own bookkeeping measured about 1.8 ms a call there on this project's CPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        return fn(*inputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad[1:])]
        wanted = [t for t in inputs if t.requires_grad]
        with torch.enable_grad():
            grads = iter(torch.autograd.grad(ctx.fn(*inputs), wanted, grad)) if wanted else iter(())
        return (None, *(next(grads) if t.requires_grad else None for t in inputs))


def recompute(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """``fn(*inputs)``, keeping only ``inputs`` for the backward pass (``fn`` runs again there).

    ``fn`` must be a pure function of its tensor arguments (buffers may be closed over); it runs
    directly, with no autograd bookkeeping, when no input needs a gradient.
    """
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in inputs):
        return fn(*inputs)
    return _Recompute.apply(fn, *inputs)
