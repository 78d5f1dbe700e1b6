"""Compiled-kernel calls checked once per input layout and kept (the inference forms of :func:`eqvit.fuse`).

A kernel called through :mod:`ctypes` trusts its pointers, shapes and strides, so every call must be
checked; in a forward at batch 1 those Python-level checks cost as much as the kernels themselves. A
module mixing in :class:`KeptKernelCalls` checks a layout (shape, strides, dtype, device) once, keeps the
call it validated, and goes straight to it for later inputs of that layout. The kept calls hold this
module's tensors, so whatever replaces one (an assignment, ``.to()``, ``.double()``) drops them, and a
copy or a pickle starts without any.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import nn

MAX_KEPT = 64  # layouts kept per module


def layout_of(x: torch.Tensor, *extra: Hashable) -> tuple:
    """What a kept call depends on: ``x``'s shape, strides, dtype and device (and ``extra``)."""
    return (x.shape, x.stride(), x.dtype, x.device, *extra)


class KeptKernelCalls(nn.Module):
    """Mix-in (before the module's base class): :meth:`kept_call` / :meth:`keep_call` per layout."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # before the base's __init__, which may already move the module (``self.to(...)``)
        object.__setattr__(self, "_kept", {})
        super().__init__(*args, **kwargs)

    def kept_call(self, layout: tuple) -> Callable | None:
        return self._kept.get(layout)

    def keep_call(self, layout: tuple, call: Callable) -> None:
        if len(self._kept) >= MAX_KEPT:  # a stream of ever new shapes: keep the recent ones only
            self._kept.clear()
        self._kept[layout] = call

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self._kept.clear()
        super().__setattr__(name, value)

    def _apply(self, fn, recurse: bool = True):
        self._kept.clear()
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_kept": {}}
