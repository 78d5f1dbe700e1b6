"""Memory a training run needs, estimated before it allocates, against what its device has.

A config can ask for a model or a batch no machine holds (``embed_dim: 1000000000``, ``depth: 1000000``,
``data.batch_size: 100000000``). Three checks refuse it with the estimate, as a
:class:`~eqvit.utils.MemoryBudgetError` (a ValueError: one paragraph and exit code 2 from the CLI):

* :func:`build_within_memory`: the model is built under :class:`AllocationGuard`, which refuses a tensor
  before it is allocated once the model's tensors would pass the machine's memory; a large ``depth`` is
  first probed at depth 1 and 2 and the parameter count extrapolated;
* :func:`check_training_memory`: parameters x 16 bytes (float32 weights, gradients and Adam's two
  moments) plus the batch x what one sample keeps for backward (its input and every block's output,
  measured by one forward of one sample) against the device's memory.

Every estimate is a lower bound: a run it lets through may still run out of memory, one it refuses
cannot fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from eqvit import utils
from eqvit.utils import check_memory, format_bytes

# Factory functions whose first argument(s) give the shape of the tensor they allocate.
_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.full, torch.empty_strided}
# depth from which a model's parameters are extrapolated from probes at depth 1 and 2 before it is built
DEPTH_PROBE = 48
TRAIN_BYTES_PER_PARAMETER = 16  # float32 weights, gradients and Adam's two moments


def _shape(args: tuple) -> tuple[int, ...] | None:
    """The shape a factory call asks for: its first argument when that is a sequence (``zeros((2, 3))``,
    ``full((2, 3), 1.0)``), else its integer arguments (``zeros(2, 3)``)."""
    if args and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    return tuple(args) if all(isinstance(a, int) and not isinstance(a, bool) for a in args) else None


class AllocationGuard(TorchFunctionMode):
    """Counts the bytes of the tensors that factory functions (``torch.empty``, ``zeros``, ``randn``, ...) create
    inside it, and raises :class:`~eqvit.utils.MemoryBudgetError` before the one that would take the total past
    ``available`` bytes."""

    def __init__(self, what: str, available: int | None) -> None:
        super().__init__()
        self.what, self.available, self.total = what, available, 0

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES and self.available is not None:
            shape = _shape(args)
            if shape is not None:
                dtype = kwargs.get("dtype") or torch.get_default_dtype()
                size = math.prod(shape) * dtype.itemsize
                check_memory(
                    self.what,
                    self.total + size,
                    f"its tensors so far and one of shape {list(shape)} of {format_bytes(size)}",
                    self.available,
                )
                self.total += size
        return func(*args, **kwargs)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build_within_memory(build: Callable[..., nn.Module], name: str, kwargs: dict[str, Any]) -> nn.Module:
    """``build(**kwargs)`` under :class:`AllocationGuard` (the machine's memory); with ``depth`` above
    :data:`DEPTH_PROBE`, the parameters of the whole model are first extrapolated from depth 1 and 2 and a
    model that could not be trained in the machine's memory is refused without being built."""
    available = utils.machine_memory()
    depth = kwargs.get("depth")
    if isinstance(depth, int) and not isinstance(depth, bool) and depth > DEPTH_PROBE:
        with torch.random.fork_rng(devices=[]):
            one, two = (
                count_parameters(_guarded(build, f"model {name!r}", {**kwargs, "depth": d}, available)) for d in (1, 2)
            )
        params = one + (depth - 1) * (two - one)
        check_memory(
            f"training model {name!r} with depth {depth:,}",
            params * TRAIN_BYTES_PER_PARAMETER,
            f"{params:,} parameters, {two - one:,} a block, x {TRAIN_BYTES_PER_PARAMETER} bytes for the weights, "
            "gradients and Adam's two moments",
            available,
        )
    return _guarded(build, f"model {name!r} with model.kwargs {kwargs}", kwargs, available)


def _guarded(build: Callable[..., nn.Module], what: str, kwargs: dict[str, Any], available: int | None) -> nn.Module:
    with AllocationGuard(what, available):
        return build(**kwargs)


def device_memory(device: torch.device) -> tuple[int | None, str]:
    """``(bytes, description)`` of the memory training on ``device`` has: the GPU's, or the machine's."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory, f"GPU {index}"
    return utils.machine_memory(), "this machine"


def _blocks(model: nn.Module) -> nn.ModuleList | None:
    """The model's stack of blocks (timm's ``blocks``, at any depth of the module tree), if it has one."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "blocks" and isinstance(module, nn.ModuleList) and len(module):
            return module
    return None


@torch.no_grad()
def sample_bytes(model: nn.Module) -> tuple[int, str]:
    """``(bytes, what)``: a lower bound of what one sample keeps in memory for backward: its input, and every
    block's output (one forward of one random sample of ``model.domain``). Models without a domain: 0."""
    domain = getattr(model, "domain", None)
    if domain is None or not hasattr(domain, "random_input") or not hasattr(model, "in_chans"):
        return 0, "no input domain to measure"
    param = next(model.parameters(), None)
    x = domain.random_input(1, model.in_chans, generator=torch.Generator().manual_seed(0))
    inputs = x if isinstance(x, tuple) else (x,)
    if param is not None:
        inputs = tuple(t.to(param.device, param.dtype if t.is_floating_point() else t.dtype) for t in inputs)
    total = sum(t.numel() * t.element_size() for t in inputs)
    blocks = _blocks(model)
    if blocks is None:
        return total, "its input"
    seen = []

    def record(module: nn.Module, args: Any, output: Any) -> None:
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        seen.append(sum(o.numel() * o.element_size() for o in outputs if torch.is_tensor(o)))

    hooks = [block.register_forward_hook(record) for block in blocks]
    was_training = model.training
    try:
        with torch.random.fork_rng(devices=[]):
            model.eval()(*inputs)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return total + sum(seen), f"its input and the outputs of its {len(blocks)} blocks"


def check_training_memory(
    model: nn.Module, name: str, batch_size: int, device: torch.device, unroll: int = 1, half: bool = False
) -> None:
    """:class:`~eqvit.utils.MemoryBudgetError` when training ``model`` at ``batch_size`` samples a step (this
    process's share; ``unroll`` forwards kept for backward, ``half``: bf16 activations) cannot fit in the
    memory of ``device``."""
    available, where = device_memory(device)
    params = count_parameters(model)
    per_sample, what = sample_bytes(model)
    per_sample = per_sample * unroll // (2 if half else 1)
    need = params * TRAIN_BYTES_PER_PARAMETER + batch_size * per_sample
    check_memory(
        f"training {name} at a batch of {batch_size:,}",
        need,
        f"{params:,} parameters x {TRAIN_BYTES_PER_PARAMETER} bytes for the weights, gradients and Adam's moments, "
        f"plus {batch_size:,} samples x {format_bytes(per_sample)} ({what})",
        available,
        where,
    )
