"""Crash-safe checkpoints: safetensors weights + a JSON sidecar, written to a temp file and renamed.

``OUT/last.safetensors`` (and ``OUT/best.safetensors``, the best evaluation's model, see ``train.patience``)
holds the model (``model.*``) and optimiser tensors (``optim.*``; ``best``: the model only);
``OUT/last.json`` the config, step, metrics and the optimiser's non-tensor state. Loading
never unpickles. Files are created with the umask's mode, like the run's other outputs.
``export_weights`` writes the plain model state dict that ``timm.create_model(name,
checkpoint_path=...)`` loads.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn


class CheckpointError(ValueError):
    """A missing, truncated or corrupt checkpoint, or one that does not fit (reported with the file's name)."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (full disk, read-only folder); says what was kept."""


class OutputDirError(ValueError):
    """An output folder that cannot be created or written to."""


# ``.{name}.{8 random characters}.tmp``: the temporaries of ``_atomic_write`` (and of mkstemp before it);
# ``.tmp{6 random characters}``: the one safetensors' ``save_file`` writes before renaming it onto ours.
TEMP_PATTERN = re.compile(r"^\.((?P<name>.+\.(safetensors|json))\.[A-Za-z0-9_]{8}\.tmp|tmp[A-Za-z0-9]{6})$")


def _reason(err: Exception) -> str:
    """``No space left on device`` from an OSError, or from safetensors' ``I/O error: ... (os error 28)``."""
    if isinstance(err, OSError):
        return err.strerror or errno.errorcode.get(err.errno or 0, "") or str(err)
    match = re.search(r"I/O error: (.*?)(?: \(os error \d+\))?$", str(err))
    return match.group(1) if match else str(err)


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``/proc/self/status``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic_write(path: Path, write) -> None:
    """``write(tmp)`` into ``.{name}.XXXXXXXX.tmp`` beside ``path``, fsync, rename onto ``path``.

    The file gets mode ``0o666`` less the umask, as ``open`` gives the run's other outputs (not the
    ``0o600`` of mkstemp, or of safetensors' own temporary file).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def clean_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove the checkpoint temporaries a killed writer left in ``folder`` (see ``TEMP_PATTERN``).

    Call it when a run starts, before anything writes there: a live writer's temporary exists only
    while it writes, and one run owns its folder.
    """
    folder = Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        if TEMP_PATTERN.match(entry.name) and entry.is_file() and not entry.is_symlink():
            try:
                entry.unlink()
                removed.append(entry)
            except FileNotFoundError:
                pass
    return removed


def prepare_output_dir(folder: str | Path, flag: str = "--out") -> Path:
    """Create ``folder`` if needed and prove it writable (create and remove a file); remove stale temporaries.

    Raises :class:`OutputDirError` with one sentence when the folder is a file, lies under a file,
    or cannot be written to (permissions, an immutable folder, a read-only or full file system).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"{flag} {folder} is a file, not a folder; choose another {flag}")
    blocker = next((p for p in folder.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise OutputDirError(f"cannot create {flag} {folder}: {blocker} is a regular file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputDirError(f"cannot create {flag} {folder}: {_reason(err)}") from None
    try:
        with tempfile.TemporaryFile(dir=folder) as fh:
            fh.write(b"eqvit")
            fh.flush()
    except OSError as err:
        raise OutputDirError(
            f"{flag} {folder} is not writable ({_reason(err)}), so no checkpoint could be saved; choose another {flag}"
        ) from None
    clean_stale_temporaries(folder)
    return folder


def check_output_file(path: str | Path, flag: str) -> Path:
    """Before long work: prove that the file ``path`` (the value of ``flag``) can be written.

    Creates its folder if needed; raises :class:`OutputDirError` in one sentence when ``path`` is a
    folder, lies under a regular file, or its folder cannot be written to.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputDirError(f"{flag} {path} is a folder; give a file name, e.g. {path / 'metrics.json'}")
    blocker = next((p for p in path.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise OutputDirError(f"cannot write {flag} {path}: {blocker} is a regular file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent) as fh:
            fh.write(b"eqvit")
    except OSError as err:
        raise OutputDirError(f"cannot write {flag} {path}: its folder is not writable ({_reason(err)})") from None
    return path


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
    had_previous = weights.is_file()
    try:
        _atomic_write(weights, lambda tmp: save_file(tensors, tmp, metadata={"eqvit": text}))
    except (OSError, SafetensorError) as err:  # a full disk reaches us from safetensors as a SafetensorError
        kept = "the previous checkpoint there is kept unchanged" if had_previous else "no earlier checkpoint existed"
        raise CheckpointWriteError(
            f"could not write the checkpoint of step {step} to {weights} ({_reason(err)}); {kept}"
        ) from None
    sidecar_path = out_dir / f"{name}.json"
    try:
        _atomic_write(sidecar_path, lambda tmp: Path(tmp).write_text(text))
    except OSError as err:
        raise CheckpointWriteError(
            f"wrote the checkpoint {weights} at step {step}, but could not update {sidecar_path} ({_reason(err)}); "
            f"the checkpoint carries its own copy of that sidecar, so it is complete"
        ) from None
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


def model_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's state dict in checkpoint ``tensors``: the ``model.*`` entries, prefix removed.

    A plain state dict (an exported one, without the prefix) is returned as it is.
    """
    if any(k.startswith("model.") for k in tensors):
        return {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    return {k: v for k, v in tensors.items() if not k.startswith(("optim.", "rng."))}


def load_model_state(model: nn.Module, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load the ``model.*`` tensors into ``model`` (strict), with a readable error.

    Names the tensors whose shapes differ (a model of another width), and the missing and
    unexpected ones (another architecture).
    """
    state = model_state(tensors)
    own = model.state_dict()
    differ = [(k, list(v.shape), list(own[k].shape)) for k, v in state.items() if k in own and own[k].shape != v.shape]
    missing = sorted(k for k in own if k not in state)
    unexpected = sorted(k for k in state if k not in own)
    if differ or missing or unexpected:
        parts = []
        if differ:
            shown = "; ".join(f"{k}: {a} in the checkpoint, {b} in the model" for k, a, b in differ[:3])
            more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
            parts.append(f"{len(differ)} tensors differ in shape, e.g. {shown}{more}")
        if missing:
            parts.append(f"{len(missing)} missing from the checkpoint, e.g. {missing[:5]}")
        if unexpected:
            parts.append(f"{len(unexpected)} not in the model, e.g. {unexpected[:5]}")
        raise CheckpointError(
            f"{source} does not fit the model ({'; '.join(parts)}); "
            "is the config's model section the one the checkpoint was trained with?"
        )
    model.load_state_dict(state, strict=True)


# Builder arguments that change how a model computes, not what it computes or which weights it has.
IMPLEMENTATION_KEYS = frozenset({"fused_attn", "impl"})


def normalise_model_config(config: dict[str, Any]) -> dict[str, Any]:
    """A model's effective ``config`` (builder arguments) as JSON values, as the sidecar stores it."""
    return json.loads(json.dumps(config, default=str))


def model_config_differences(
    checkpoint_model: dict[str, Any], model_name: str, model_kwargs: dict[str, Any], effective: dict[str, Any] | None
) -> list[str]:
    """``["residual: false in the config, true in the checkpoint", ...]`` between a checkpoint and a model.

    ``checkpoint_model`` is the sidecar's ``config.model`` plus, where recorded, the effective
    builder arguments ``model_config``; ``effective`` those of the model built now. Without the
    recorded effective arguments (older checkpoints) the checkpoint's ``model.kwargs`` are
    compared with the effective arguments of the model built now.
    """

    def show(value: Any) -> str:
        return json.dumps(value, default=str)

    diffs = []
    ckpt_name = checkpoint_model.get("name")
    if ckpt_name is not None and ckpt_name != model_name:  # another entry point: its arguments differ anyway
        return [f"model.name: {model_name!r} in the config, {ckpt_name!r} in the checkpoint"]
    recorded = checkpoint_model.get("model_config")
    if recorded is not None and effective is not None:
        now = normalise_model_config(effective)
        for key in sorted(set(recorded) | set(now)):
            if key in IMPLEMENTATION_KEYS:
                continue
            a, b = now.get(key, "(absent)"), recorded.get(key, "(absent)")
            if a != b:
                diffs.append(f"{key}: {show(a)} in the config, {show(b)} in the checkpoint")
        return diffs
    ckpt_kwargs = normalise_model_config(checkpoint_model.get("kwargs") or {})
    now = normalise_model_config(effective if effective is not None else model_kwargs)
    for key in sorted(ckpt_kwargs):
        if key in IMPLEMENTATION_KEYS:
            continue
        if key in now and now[key] != ckpt_kwargs[key]:
            diffs.append(f"{key}: {show(now[key])} in the config, {show(ckpt_kwargs[key])} in the checkpoint")
    return diffs


def check_model_config(
    sidecar: dict[str, Any], model_name: str, model_kwargs: dict[str, Any], model: nn.Module, source: str
) -> None:
    """CheckpointError naming the fields in which ``model`` (built from the config) differs from the checkpoint's."""
    config = sidecar.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        return  # no record of the model (an exported state dict): the tensors' shapes are checked on load
    checkpoint_model = dict(config["model"])
    if sidecar.get("model_config") is not None:
        checkpoint_model["model_config"] = sidecar["model_config"]
    diffs = model_config_differences(checkpoint_model, model_name, model_kwargs, getattr(model, "config", None))
    if diffs:
        raise CheckpointError(
            f"{source} was trained with another model than the config describes: {'; '.join(diffs)}. "
            f"Use the config the run was trained with (its copy is in {Path(source).with_suffix('.json')})"
        )


def export_weights(checkpoint: str | Path, out: str | Path) -> tuple[Path, dict[str, Any]]:
    """Write ``checkpoint``'s model weights to ``out`` as a plain state dict (no ``model.`` prefix).

    ``timm.create_model(name, checkpoint_path=out)`` (after ``import eqvit``) and
    ``eqvit.create_model(name, checkpoint_path=out)`` load it. The metadata records the model's
    name and ``model.kwargs``. Returns ``(out, sidecar)``.
    """
    tensors, sidecar = load_checkpoint(checkpoint)
    state = {k: v.contiguous() for k, v in model_state(tensors).items()}
    if not state:
        raise CheckpointError(f"checkpoint {checkpoint} holds no model weights")
    out = Path(out)
    if out.suffix != ".safetensors":
        raise ValueError(
            f"expected an output path ending in .safetensors (the state dict) or .onnx (the model for onnxruntime), "
            f"got {out}"
        )
    check_output_file(out, "the export target")
    model = (sidecar.get("config") or {}).get("model") or {}
    metadata = {
        "format": "pt",
        "eqvit_model": str(model.get("name", "")),
        "eqvit_kwargs": json.dumps(model.get("kwargs") or {}, default=str),
        "eqvit_relaxed": json.dumps(sidecar.get("relaxed") or []),
        "eqvit_step": str(sidecar.get("step", "")),
    }
    try:
        _atomic_write(out, lambda tmp: save_file(state, tmp, metadata=metadata))
    except (OSError, SafetensorError) as err:
        raise CheckpointWriteError(f"could not write {out} ({_reason(err)})") from None
    return out, sidecar
