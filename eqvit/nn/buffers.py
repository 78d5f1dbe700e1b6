"""Derived tensors: geometry buffers kept exact under dtype changes, parameter-derived caches."""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch import nn


class ExactBuffers(nn.Module):
    """A module whose geometry buffers are re-derived from float64 masters on ``.to()``.

    A buffer built in float32 and later cast with ``.double()`` keeps float32 round-off, which
    shows up as ~1e-8 equivariance errors in float64 checks. Registering it here keeps a float64
    master and re-casts that on every ``_apply`` (``.double()``, ``.float()``, ``.to(device)``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._exact_masters: dict[str, torch.Tensor] = {}

    def register_exact_buffer(self, name: str, value: torch.Tensor) -> None:
        master = value.detach().to(device="cpu", dtype=torch.float64)
        self._exact_masters[name] = master
        self.register_buffer(name, master.to(torch.get_default_dtype()), persistent=False)

    def __setattr__(self, name: str, value) -> None:
        # Assigning a new tensor to an exact buffer replaces its master too, so a later
        # .double() / .to() does not silently restore the old values.
        masters = self.__dict__.get("_exact_masters")
        if masters is not None and name in masters and isinstance(value, torch.Tensor) and not self._in_apply:
            masters[name] = value.detach().to(device="cpu", dtype=torch.float64)
        super().__setattr__(name, value)

    _in_apply = False

    def _apply(self, fn, recurse: bool = True):
        # A buffer changed in place since its master was taken (``buffer.mul_(2)``, an edited
        # geometry) is the truth now: adopt it as the master, so that a cast does not silently undo
        # the change (an equivariance check on a float64 copy must see the model as it is).
        for name, master in self._exact_masters.items():
            current = getattr(self, name)
            if not torch.equal(current, master.to(device=current.device, dtype=current.dtype)):
                self._exact_masters[name] = current.detach().to(device="cpu", dtype=torch.float64)
        super()._apply(fn, recurse)
        object.__setattr__(self, "_in_apply", True)
        try:
            for name, master in self._exact_masters.items():
                current = getattr(self, name)
                setattr(self, name, fn(master).to(dtype=current.dtype, device=current.device))
        finally:
            object.__setattr__(self, "_in_apply", False)
        return self


_VERSION = operator.attrgetter("_version")
_DATA_PTR = torch.Tensor.data_ptr
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _mode(device_type: str) -> tuple:
    """What a derived value depends on besides its sources: inference mode and the autocast state
    (enabled and its dtype) of the sources' device type."""
    if torch.is_autocast_enabled(device_type):
        return (torch.is_inference_mode_enabled(), torch.get_autocast_dtype(device_type))
    return (torch.is_inference_mode_enabled(), None)


class DerivedCache(nn.Module):
    """Caches tensors derived from parameters (dense weights) while no gradient is recorded.

    ``derived(name, sources, compute)`` recomputes whenever autograd could need the graph (grad
    mode on and a source requires grad). Otherwise the value is reused while every source tensor is
    the same storage at the same in-place version (``_version`` counts ``optimizer.step()``,
    ``copy_``, ``load_state_dict``, ...) in the same inference mode and the same autocast state of
    the sources' device (enabled, dtype), so a value computed under ``torch.autocast`` (in bf16) is
    never handed to an fp32 forward, nor the other way round; the sources are read afresh on
    every call (a replaced parameter is noticed) and kept alive with the entry (their addresses are
    not reused). Composite modules pass their children's parameters (:meth:`IrrepLinear.leaves`).
    ``train()``/``eval()`` and ``.to()``/``.double()`` clear the cache.
    """

    def derived(self, name: str, sources: list[torch.Tensor | None], compute: Callable[[], object]) -> object:
        sources = [t for t in sources if t is not None]
        if torch.is_grad_enabled() and any(map(_REQUIRES_GRAD, sources)):
            return compute()
        cache = self.__dict__.get("_derived_cache")
        if cache is None:
            cache = self.__dict__["_derived_cache"] = {}
        try:
            versions = list(map(_VERSION, sources))
        except RuntimeError:  # inference tensors (made under inference_mode) track no version: never cache
            return compute()
        mode = _mode(sources[0].device.type if sources else "cpu")
        hit = cache.get(name)
        # Checked cheapest first; this runs for every cached weight on every forward.
        if hit is not None and hit[1] == versions and hit[0] == mode and hit[2] == list(map(_DATA_PTR, sources)):
            return hit[3]
        value = compute()
        cache[name] = (mode, versions, list(map(_DATA_PTR, sources)), value, sources)
        return value

    def clear_derived_cache(self) -> None:
        self.__dict__.pop("_derived_cache", None)

    def train(self, mode: bool = True):
        self.clear_derived_cache()
        return super().train(mode)

    def _apply(self, fn, recurse: bool = True):
        self.clear_derived_cache()
        return super()._apply(fn, recurse)

    def __getstate__(self):
        state = dict(super().__getstate__())  # deepcopy / pickle: the cache is not copied
        state.pop("_derived_cache", None)
        return state
