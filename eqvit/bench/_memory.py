"""Peak allocated tensor memory of a call on any device: the CPU analogue of
``torch.cuda.max_memory_allocated``.

The rise of the process' resident set (what ``scale_speed`` also reports) depends on the C
allocator: freed blocks it keeps, fragmentation, its mmap threshold. This counts what the model
itself holds: every tensor storage an op creates during the call is added when created and
subtracted when freed, and the maximum is kept. Parameters and buffers that exist before the call
are not counted; gradients created during it are.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class _LiveStorages(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.current = self.peak = 0
        self._live: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # An op's output that shares an input's storage (in-place and out= ops, views) is no allocation:
        # the parameters and optimizer state updated in place existed before the call.
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._live and key not in inputs:  # a new storage
                    self._live.add(key)
                    self.current += storage.nbytes()
                    weakref.finalize(storage, self._free, key, storage.nbytes())
        self.peak = max(self.peak, self.current)
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self.current -= nbytes
        self._live.discard(key)


def peak_allocated_mb(step: Callable[[], Any]) -> float:
    """MiB: the most tensor memory alive at any point of ``step()`` that ``step`` allocated."""
    with _LiveStorages() as tracker:
        step()
    return tracker.peak / 2**20
