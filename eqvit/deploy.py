"""Deployment: ``torch.export`` with a free batch size, and ONNX through PyTorch's dynamo exporter.

Every registered family exports in both forms (the training form and ``eqvit.fold``'s inference form):
the models are standard PyTorch ops with no Python control flow on the batch size. The ONNX file is
checked in onnxruntime against eager PyTorch before it is kept (``onnx`` extra: onnx, onnxscript,
onnxruntime).

    program = eqvit.deploy.export_program(model)              # torch.export.ExportedProgram
    eqvit.deploy.export_onnx(eqvit.fold(model), "model.onnx")  # verified in onnxruntime
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from eqvit.utils import atomic_write, require_extra

# The dynamo exporter's output agrees with eager PyTorch to float32 round-off; 1e-4 relative is the check.
ONNX_TOLERANCE = 1e-4
EXAMPLE_BATCH, CHECK_BATCH = 2, 3  # export at one batch size, verify at another


def example_inputs(model: nn.Module, batch: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random inputs the model takes (``model.domain.random_input``), as the tuple of its call's arguments."""
    like = next(model.parameters(), None)
    dtype = like.dtype if like is not None else torch.float32
    gen = torch.Generator().manual_seed(seed)
    inputs = model.domain.random_input(batch, model.in_chans, generator=gen, dtype=dtype)
    return inputs if isinstance(inputs, tuple) else (inputs,)


def batch_dynamic_shapes(inputs: tuple[torch.Tensor, ...]) -> list[dict[int, torch.export.Dim]]:
    """One free batch size shared by every input (``[{0: Dim("batch")}]``, the spelling timm users write)."""
    batch = torch.export.Dim("batch")
    return [{0: batch} for _ in inputs]


def export_program(model: nn.Module, inputs: tuple[torch.Tensor, ...] | None = None) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``model`` (in eval mode) with a free batch size: the program runs any batch."""
    model = model.eval()
    inputs = inputs if inputs is not None else example_inputs(model, EXAMPLE_BATCH)
    return torch.export.export(model, inputs, dynamic_shapes=batch_dynamic_shapes(inputs))


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |got - expected| / max |expected|``."""
    got, expected = got.detach(), expected.detach()
    return float((got - expected).abs().max() / expected.abs().max().clamp_min(torch.finfo(expected.dtype).tiny))


@contextlib.contextmanager
def _quiet_onnx_ir() -> Iterator[None]:
    """onnx_ir warns on every empty attribute list the exporter writes (it defaults them to INTS, which is
    right for ours): keep those notes out of the user's terminal while exporting."""
    log = logging.getLogger("onnx_ir")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def export_onnx(model: nn.Module, path: str | Path, tolerance: float = ONNX_TOLERANCE) -> float:
    """Write ``model`` (eval mode) to the ONNX file ``path`` with a free batch size (the dynamo exporter), run it
    in onnxruntime on a batch of another size and compare with eager PyTorch.

    Returns the relative error; a ValueError (and no file) when it exceeds ``tolerance``, a
    :class:`~eqvit.utils.MissingExtraError` naming the ``onnx`` extra when onnx, onnxscript or onnxruntime is
    missing.
    """
    require_onnx()
    import onnxruntime

    model = model.eval()
    path = Path(path)
    inputs = example_inputs(model, EXAMPLE_BATCH)
    errors = []

    def write(tmp: str) -> None:
        # one self-contained file (the weights inside, no external data file beside it)
        with _quiet_onnx_ir():
            torch.onnx.export(
                model,
                inputs,
                tmp,
                dynamo=True,
                dynamic_shapes=batch_dynamic_shapes(inputs),
                external_data=False,
                verbose=False,
            )
        check = example_inputs(model, CHECK_BATCH, seed=1)
        session = onnxruntime.InferenceSession(tmp)
        feeds = {arg.name: x.detach().cpu().numpy() for arg, x in zip(session.get_inputs(), check)}
        got = torch.from_numpy(session.run(None, feeds)[0])
        with torch.no_grad():
            expected = model(*check).float().cpu()
        err = relative_error(got, expected)
        if not err <= tolerance:
            raise ValueError(
                f"the ONNX export of {type(model).__name__} differs from eager PyTorch in onnxruntime by {err:.2e} "
                f"(relative, batch {CHECK_BATCH}; tolerance {tolerance:.0e}): nothing was written to {path}"
            )
        errors.append(err)

    # verified in a temporary of its own, then renamed, with the umask's mode (not mkstemp's 0600)
    atomic_write(path, write)
    return errors[0]


def require_onnx() -> None:
    """:class:`~eqvit.utils.MissingExtraError` naming the ``onnx`` extra unless its packages import."""
    require_extra("onnx", ("onnx", "onnxscript", "onnxruntime"), "ONNX export")
