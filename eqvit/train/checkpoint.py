"""Crash-safe checkpoints: safetensors weights + a JSON sidecar, written to a temp file and renamed.

``OUT/last.safetensors`` (and ``OUT/best.safetensors``, the best evaluation's model, see ``train.patience``)
holds the model (``model.*``) and optimiser tensors (``optim.*``; ``best``: the model only);
``OUT/last.json`` the config, step, metrics and the optimiser's non-tensor state. Loading
never unpickles. Files are created with the umask's mode, like the run's other outputs.
``export_weights`` writes the plain model state dict that ``timm.create_model(name,
checkpoint_path=...)`` loads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from eqvit.utils import atomic_write as _atomic_write


class CheckpointError(ValueError):
    """A missing, truncated or corrupt checkpoint, or one that does not fit (reported with the file's name)."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (full disk, read-only folder); says what was kept."""


class OutputDirError(ValueError):
    """An output folder that cannot be created or written to."""


# ``.{name}.{8 random characters}.tmp``: the temporaries of ``eqvit.utils.atomic_write`` (and of mkstemp);
# ``.tmp{6 random characters}``: the one safetensors' ``save_file`` writes before renaming it onto ours.
TEMP_PATTERN = re.compile(r"^\.((?P<name>.+\.(safetensors|json))\.[A-Za-z0-9_]{8}\.tmp|tmp[A-Za-z0-9]{6})$")


def _reason(err: Exception) -> str:
    """``No space left on device`` from an OSError, or from safetensors' ``I/O error: ... (os error 28)``."""
    if isinstance(err, OSError):
        return err.strerror or errno.errorcode.get(err.errno or 0, "") or str(err)
    match = re.search(r"I/O error: (.*?)(?: \(os error \d+\))?$", str(err))
    return match.group(1) if match else str(err)


def clean_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove the checkpoint temporaries a killed writer left in ``folder`` (see ``TEMP_PATTERN``).

    Call it while holding the folder's :class:`RunLock`: a live writer's temporary exists only while
    it writes, and the lock's holder is the only writer.
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


def check_symlink(path: str | Path, flag: str) -> None:
    """OutputDirError when ``path`` is a symbolic link that loops or points nowhere (``mkdir`` would only say
    "File exists")."""
    path = Path(path)
    if not path.is_symlink():
        return
    try:
        os.stat(path)
    except OSError as err:
        target = os.readlink(path)
        if err.errno == errno.ELOOP:
            raise OutputDirError(
                f"{flag} {path} is a symbolic link that loops ({path} -> {target} -> ...); "
                f"remove it or choose another {flag}"
            ) from None
        raise OutputDirError(
            f"{flag} {path} is a symbolic link to {target}, which does not exist; create it or choose another {flag}"
        ) from None


def check_out_path(path: str | Path | None, flag: str) -> None:
    """OutputDirError for an empty ``flag`` value (a path of no characters would mean the current folder)."""
    if path is not None and not str(path).strip():
        raise OutputDirError(f"{flag} is empty; give a folder name, e.g. {flag} runs/my_run")


def prepare_output_dir(folder: str | Path, flag: str = "--out") -> Path:
    """Create ``folder`` if needed and prove it writable (create and remove a file).

    Raises :class:`OutputDirError` with one sentence when the folder is empty, a file, a symbolic link
    that loops or dangles, lies under a file, or cannot be written to (permissions, an immutable
    folder, a read-only or full file system). Stale temporaries are removed by the run that holds the
    folder's lock (:class:`RunLock`), not here.
    """
    check_out_path(folder, flag)
    folder = Path(folder)
    check_symlink(folder, flag)
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
    return folder


class RunLock:
    """An advisory lock (``fcntl.flock``) on ``folder/.eqvit.lock``: one run writes into a folder at a time.

    :meth:`acquire` raises :class:`OutputDirError` naming the process that holds it. Within one process
    the lock is shared (a run paused and resumed by a new ``Trainer`` keeps its folder); it is dropped
    when every holder has called :meth:`release`. The file records the holder's pid and is removed on
    the last release (the kernel drops the lock of a killed process; the file it leaves is locked again
    by the next run).
    """

    NAME = ".eqvit.lock"
    _held: ClassVar[dict[str, list]] = {}  # real path of the lock file -> [fd, holders] in this process

    def __init__(self, path: Path) -> None:
        self.path, self._key = path, os.path.realpath(path)

    @classmethod
    def acquire(cls, folder: str | Path, flag: str = "--out") -> RunLock:
        lock = cls(Path(folder) / cls.NAME)
        held = cls._held.get(lock._key)
        if held is not None:
            held[1] += 1
        else:
            cls._held[lock._key] = [lock._lock(flag), 1]
        return lock

    @classmethod
    def check_free(cls, folder: str | Path, flag: str = "--out") -> None:
        """OutputDirError naming the holder when another process holds the lock of ``folder``; creates nothing
        (a read-only folder is then reported by whoever writes to it)."""
        path = Path(folder) / cls.NAME
        if os.path.realpath(path) in cls._held:
            return
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return  # no lock file: nobody holds the folder
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(path, _read_pid(fd), flag) from None
        except OSError:
            pass
        finally:
            os.close(fd)

    def _lock(self, flag: str) -> int:
        """An open descriptor of the lock file, flock-ed by this process."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise _in_use(self.path, holder, flag) from None
            except OSError:  # a file system without locks (some network mounts): run unlocked
                return fd
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a file that its previous holder removed while we waited on it
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return fd
            os.close(fd)

    def release(self) -> None:
        """Give this holder's share back; the last one removes the lock file and drops the lock (idempotent)."""
        if self._key is None:
            return
        held = self._held.get(self._key)
        self._key, key = None, self._key
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del self._held[key]
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(held[0])


def _in_use(path: Path, holder: str, flag: str) -> OutputDirError:
    return OutputDirError(
        f"{flag} {path.parent} is in use by another eqvit train ({holder}, holding the lock {path}); "
        f"wait for it to end, stop it, or choose another {flag}"
    )


def _read_pid(fd: int) -> str:
    """``"pid 1234"`` from a lock file, or ``"pid unknown"`` while its holder has not written it yet."""
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "pid unknown"


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
            metadata = fh.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {err}") from None
    try:
        if "eqvit" in metadata:
            sidecar = json.loads(metadata["eqvit"])
        elif "eqvit_model" in metadata:
            sidecar = _export_sidecar(metadata)
        else:
            sidecar = json.loads(sidecar_path.read_text()) if sidecar_path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint sidecar of {path} is not valid JSON: {err}") from None
    if not isinstance(sidecar, dict):
        raise CheckpointError(f"checkpoint sidecar of {path}: expected a JSON object, got {type(sidecar).__name__}")
    return tensors, sidecar


def _export_sidecar(metadata: dict[str, str]) -> dict[str, Any]:
    """What an exported state dict (:func:`export_weights`) records, in a sidecar's layout: the model's name,
    ``model.kwargs``, its effective builder arguments and the subgroups the run was restricted to."""
    sidecar: dict[str, Any] = {"relaxed": json.loads(metadata.get("eqvit_relaxed") or "[]")}
    if metadata["eqvit_model"]:
        kwargs = json.loads(metadata.get("eqvit_kwargs") or "{}")
        sidecar["config"] = {"model": {"name": metadata["eqvit_model"], "kwargs": kwargs}}
    if metadata.get("eqvit_model_config"):
        sidecar["model_config"] = json.loads(metadata["eqvit_model_config"])
    return sidecar


def recorded_model(sidecar: dict[str, Any], source: str | Path) -> dict[str, Any]:
    """The sidecar's ``config.model`` (``{}`` when it records none); a CheckpointError when it is malformed."""
    config = sidecar.get("config")
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise CheckpointError(f"checkpoint {source}: expected its config to be a mapping, got {type(config).__name__}")
    model = config.get("model")
    if model is None:
        return {}
    if not isinstance(model, dict) or not isinstance(model.get("kwargs") or {}, dict):
        raise CheckpointError(
            f"checkpoint {source}: expected config.model to be a mapping with a name and a kwargs mapping, "
            f"got {model!r}"
        )
    if "name" in model and not isinstance(model["name"], str):
        raise CheckpointError(f"checkpoint {source}: expected config.model.name to be a string, got {model['name']!r}")
    return model


def check_resume_state(tensors: dict[str, torch.Tensor], sidecar: dict[str, Any], source: str | Path) -> None:
    """CheckpointError naming the first part of the training state that ``source`` lacks or holds malformed
    (step, history, optimiser, RNG states), before anything of it is restored."""

    def refuse(what: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {source} cannot be resumed: {what}. Its weights can still be read by eqvit eval and "
            "eqvit export; start a new run with --overwrite or another --out"
        )

    step = sidecar.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise refuse(f"expected 'step' to be an integer >= 0, got {step!r}")
    history = sidecar.get("history")
    if not isinstance(history, dict) or not all(isinstance(history.get(k), list) for k in ("train", "evals")):
        raise refuse(f"expected 'history' to hold the lists 'train' and 'evals', got {_short(history)}")
    rows = [row for key in ("train", "evals") for row in history[key]]
    if not all(isinstance(row, dict) and isinstance(row.get("step"), int) for row in rows):
        raise refuse("expected every row of 'history' to be a mapping with a 'step'")
    optimizer = sidecar.get("optimizer")
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("param_groups"), list):
        raise refuse(f"expected 'optimizer' to hold the optimiser's 'param_groups', got {_short(optimizer)}")
    if not isinstance(optimizer.get("state", {}), dict):
        raise refuse("expected 'optimizer.state' to be a mapping")
    elapsed = sidecar.get("elapsed_seconds", 0.0)
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)):
        raise refuse(f"expected 'elapsed_seconds' to be a number, got {elapsed!r}")
    relaxed = sidecar.get("relaxed", [])
    if not isinstance(relaxed, list) or not all(isinstance(name, str) for name in relaxed):
        raise refuse(f"expected 'relaxed' to be a list of subgroup names, got {relaxed!r}")
    if not isinstance(sidecar.get("plateau"), (dict, type(None))):
        raise refuse("expected 'plateau' to be a mapping or null")
    expected = torch.get_rng_state()
    rng = tensors.get("rng.torch")
    if rng is None or rng.dtype != expected.dtype or rng.shape != expected.shape:
        got = "nothing" if rng is None else f"{rng.dtype} {list(rng.shape)}"
        raise refuse(f"expected the tensor 'rng.torch' ({expected.dtype} {list(expected.shape)}), got {got}")
    if "rng.data" not in tensors:
        raise refuse("the data stream's state (the tensor 'rng.data') is missing")


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


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


def restore_optimizer_state(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], plain: dict[str, Any], source: str | Path
) -> None:
    """:func:`load_optimizer_state` with a CheckpointError naming ``source`` when the state does not fit."""
    try:
        load_optimizer_state(optimizer, tensors, plain)
    except (KeyError, ValueError, TypeError, IndexError) as err:
        raise CheckpointError(
            f"checkpoint {source}: the optimiser state does not fit this model's optimiser ({type(err).__name__}: "
            f"{err})"
        ) from None


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
    recorded = recorded_model(sidecar, source)
    if not recorded:
        return  # no record of the model (a foreign state dict): the tensors' shapes are checked on load
    checkpoint_model = dict(recorded)
    if sidecar.get("model_config") is not None:
        checkpoint_model["model_config"] = sidecar["model_config"]
    diffs = model_config_differences(checkpoint_model, model_name, model_kwargs, getattr(model, "config", None))
    if diffs:
        copy = Path(source).with_suffix(".json")
        where = f"its copy is in {copy}" if copy.is_file() else f"{source} records its model.name and model.kwargs"
        raise CheckpointError(
            f"{source} was trained with another model than the config describes: {'; '.join(diffs)}. "
            f"Use the config the run was trained with ({where})"
        )


def check_export_target(checkpoint: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """The export target ``out``, refused (OutputDirError) when it is the checkpoint itself (always: that would
    replace a run's checkpoint by its bare weights) or an existing file (unless ``overwrite``)."""
    check_out_path(out, "the export target")
    out = Path(out)
    check_symlink(out, "the export target")
    if out.exists() and Path(checkpoint).exists() and os.path.samefile(out, checkpoint):
        raise OutputDirError(
            f"the export target {out} is the checkpoint being exported; writing it would replace the run's "
            "checkpoint by its bare weights. Choose another file name"
        )
    if out.exists() and not out.is_dir() and not overwrite:
        raise OutputDirError(f"the export target {out} exists; pass --overwrite to replace it, or choose another name")
    return check_output_file(out, "the export target")


def export_weights(checkpoint: str | Path, out: str | Path, overwrite: bool = False) -> tuple[Path, dict[str, Any]]:
    """Write ``checkpoint``'s model weights to ``out`` as a plain state dict (no ``model.`` prefix).

    ``timm.create_model(name, checkpoint_path=out)`` (after ``import eqvit``) and
    ``eqvit.create_model(name, checkpoint_path=out)`` load it. The metadata records the model's
    name, ``model.kwargs`` and effective builder arguments, so ``eqvit eval`` can compare them with
    a config. An existing ``out`` is replaced only with ``overwrite``, the checkpoint itself never.
    Returns ``(out, sidecar)``.
    """
    out = Path(out)
    if out.suffix != ".safetensors":
        raise ValueError(
            f"expected an output path ending in .safetensors (the state dict) or .onnx (the model for onnxruntime), "
            f"got {out}"
        )
    tensors, sidecar = load_checkpoint(checkpoint)
    state = {k: v.contiguous() for k, v in model_state(tensors).items()}
    if not state:
        raise CheckpointError(f"checkpoint {checkpoint} holds no model weights")
    model = recorded_model(sidecar, checkpoint)
    check_export_target(checkpoint, out, overwrite)
    metadata = {
        "format": "pt",
        "eqvit_model": str(model.get("name", "")),
        "eqvit_kwargs": json.dumps(model.get("kwargs") or {}, default=str),
        "eqvit_relaxed": json.dumps(sidecar.get("relaxed") or []),
        "eqvit_step": str(sidecar.get("step", "")),
    }
    if isinstance(sidecar.get("model_config"), dict):
        metadata["eqvit_model_config"] = json.dumps(sidecar["model_config"], default=str)
    try:
        _atomic_write(out, lambda tmp: save_file(state, tmp, metadata=metadata))
    except (OSError, SafetensorError) as err:
        raise CheckpointWriteError(f"could not write {out} ({_reason(err)})") from None
    return out, sidecar
