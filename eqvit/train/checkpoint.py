"""Crash-safe checkpoints: safetensors weights + a JSON sidecar, written to a temp file and renamed.

``OUT/last.safetensors`` holds the model (``model.*``) and optimiser tensors (``optim.*``);
``OUT/last.json`` the config, step, metrics and the optimiser's non-tensor state. Loading
never unpickles.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn


class CheckpointError(ValueError):
    """A missing, truncated or corrupt checkpoint (reported with the file's name)."""


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> tuple[dict[str, torch.Tensor], dict]:
    if optimizer is None:
        return {}, {}
    state = optimizer.state_dict()
    tensors, plain = {}, {"param_groups": state["param_groups"], "state": {}}
    for idx, entries in state["state"].items():
        for key, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"optim.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                plain["state"].setdefault(str(idx), {})[key] = value
    return tensors, plain


def save_checkpoint(
    out_dir: str | Path,
    model: nn.Module,
    *,
    step: int,
    config: dict[str, Any],
    metrics: dict[str, Any] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    name: str = "last",
) -> Path:
    """Write ``out_dir/{name}.safetensors`` then ``out_dir/{name}.json`` atomically.

    ``extra_tensors`` (e.g. RNG states) are stored under their own keys; ``extra`` goes into
    the JSON sidecar. The weights are renamed into place before the sidecar, and the sidecar
    records the step, so a crash between the two is detected on load.
    """
    out_dir = Path(out_dir)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    optim_tensors, optim_plain = _optimizer_tensors(optimizer)
    tensors.update(optim_tensors)
    tensors.update({k: v.detach().cpu().contiguous() for k, v in (extra_tensors or {}).items()})
    sidecar = {
        "step": step,
        "config": config,
        "metrics": metrics or {},
        "optimizer": optim_plain,
        "weights": f"{name}.safetensors",
        **(extra or {}),
    }
    text = json.dumps(sidecar, indent=2, default=str)
    weights = out_dir / f"{name}.safetensors"
    # The sidecar also travels inside the safetensors metadata, so the one atomically renamed
    # file is self-consistent even if a crash hits between the two renames.
    _atomic_write(weights, lambda tmp: save_file(tensors, tmp, metadata={"eqvit": text}))
    _atomic_write(out_dir / f"{name}.json", lambda tmp: Path(tmp).write_text(text))
    return weights


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read ``path`` (``.safetensors``; the ``.json`` sidecar beside it) -> (tensors, sidecar)."""
    path = Path(path)
    if path.suffix == ".json":
        path = path.with_suffix(".safetensors")
    sidecar_path = path.with_suffix(".json")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as fh:
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
            embedded = (fh.metadata() or {}).get("eqvit")
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {err}") from None
    try:
        if embedded is not None:
            sidecar = json.loads(embedded)
        else:
            sidecar = json.loads(sidecar_path.read_text()) if sidecar_path.is_file() else {}
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint sidecar of {path} is not valid JSON: {err}") from None
    return tensors, sidecar


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], plain: dict[str, Any]
) -> None:
    """Rebuild ``optimizer``'s state dict from the ``optim.*`` tensors and the sidecar's plain part."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = value
    for idx, entries in plain.get("state", {}).items():
        state.setdefault(int(idx), {}).update(entries)
    optimizer.load_state_dict({"state": state, "param_groups": plain["param_groups"]})


def load_model_state(model: nn.Module, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load the ``model.*`` tensors into ``model`` (strict), with a readable error."""
    state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not fit the model: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
