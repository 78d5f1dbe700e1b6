"""Geometry buffers kept exact under dtype changes (float64 masters).

Nothing here caches tensors derived from parameters: the training forward derives them on every
call, and :func:`eqvit.fold` computes them once for inference.
"""

from __future__ import annotations

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

    def register_exact_buffer(self, name: str, value: torch.Tensor, like: torch.Tensor | None = None) -> None:
        """Register ``value``'s float64 master and a non-persistent buffer cast from it: to the default dtype,
        or to ``like``'s dtype and device."""
        master = value.detach().to(device="cpu", dtype=torch.float64)
        self._exact_masters[name] = master
        cast = master.to(torch.get_default_dtype()) if like is None else master.to(like.device, like.dtype)
        self.register_buffer(name, cast, persistent=False)

    def __setattr__(self, name: str, value) -> None:
        # Assigning a new tensor to an exact buffer replaces its master too, so a later
        # .double() / .to() does not silently restore the old values.
        masters = self.__dict__.get("_exact_masters")
        if masters is not None and name in masters and isinstance(value, torch.Tensor) and not self._in_apply:
            masters[name] = value.detach().to(device="cpu", dtype=torch.float64)
        super().__setattr__(name, value)

    def exact_buffer(self, name: str) -> torch.Tensor:
        """Buffer ``name`` in float64 on the CPU: its master, unless the buffer was changed in place since."""
        master, current = self._exact_masters[name], getattr(self, name)
        # A buffer on the meta device holds no values, so nothing can have changed it: the master stands.
        if current.is_meta or torch.equal(current, master.to(device=current.device, dtype=current.dtype)):
            return master
        return current.detach().to(device="cpu", dtype=torch.float64)

    _in_apply = False

    def _apply(self, fn, recurse: bool = True):
        # A buffer changed in place since its master was taken (``buffer.mul_(2)``, an edited
        # geometry) is the truth now: adopt it as the master, so that a cast does not silently undo
        # the change (an equivariance check on a float64 copy must see the model as it is).
        for name in self._exact_masters:
            self._exact_masters[name] = self.exact_buffer(name)
        super()._apply(fn, recurse)
        object.__setattr__(self, "_in_apply", True)
        try:
            for name, master in self._exact_masters.items():
                current = getattr(self, name)
                setattr(self, name, fn(master).to(dtype=current.dtype, device=current.device))
        finally:
            object.__setattr__(self, "_in_apply", False)
        return self
