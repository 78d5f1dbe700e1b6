"""Small helpers shared across eqvit (no torch.nn)."""

from __future__ import annotations

import difflib
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path


def close_match_hint(name: str, valid: Iterable[str]) -> str:
    """``" Did you mean 'x'?"`` for the closest of ``valid`` to ``name``, or ``""``."""
    valid = [str(v) for v in valid]
    same_but_case = [v for v in valid if v.lower() == str(name).lower()]
    close = same_but_case or difflib.get_close_matches(str(name), valid, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def unknown_name_error(kind: str, name: str, valid: Iterable[str], cls: type[ValueError] = ValueError) -> ValueError:
    """A ValueError (or subclass ``cls``) for an unknown ``name`` that lists the valid ones and the closest match."""
    valid = list(valid)
    shown = ", ".join(str(v) for v in valid[:40]) + (", ..." if len(valid) > 40 else "")
    return cls(f"unknown {kind} {name!r}.{close_match_hint(name, valid)} Valid: {shown}")


def cache_dir() -> Path:
    """Where eqvit keeps what it derives once per machine (parsed datasets):
    ``$EQVIT_CACHE``, default ``~/.cache/eqvit``."""
    return Path(os.environ.get("EQVIT_CACHE", "~/.cache/eqvit")).expanduser()


def umask() -> int:
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


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` into a temporary ``.{name}.XXXXXXXX.tmp`` of its own beside ``path``, fsync, rename onto
    ``path``: readers see the old file or the whole new one, and writers at the same time do not collide.

    The file gets mode ``0o666`` less the umask, as ``open`` gives other files (``0644``; ``0664`` for a
    group-shared umask), not the ``0o600`` of ``mkstemp``, or of safetensors' own temporary file.
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
        os.chmod(tmp, 0o666 & ~umask())
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class MemoryBudgetError(ValueError):
    """Work that would need more memory than the machine has, refused before it allocates (the message gives the
    estimate and how it was made)."""


def machine_memory() -> int | None:
    """The machine's physical memory in bytes (``os.sysconf``), or None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(count: float) -> str:
    """``"7.28 TiB"``: a byte count in binary units."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(count) < 1024 or unit == "PiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1024
    return f"{count:.2f} PiB"


def check_memory(what: str, need: float, how: str, available: int | None = None, where: str = "this machine") -> None:
    """:class:`MemoryBudgetError` when ``what`` needs more than ``available`` bytes (default: the machine's memory).

    ``need`` is a lower estimate and ``how`` says how it was made, e.g. ``"1000000000000 steps x 7.7 KiB"``.
    """
    available = machine_memory() if available is None else available
    if available is not None and need > available:
        raise MemoryBudgetError(
            f"{what} needs at least {format_bytes(need)} ({how}), more than the {format_bytes(available)} of "
            f"memory of {where}"
        )


class MissingExtraError(ValueError, ModuleNotFoundError):
    """An optional dependency is not installed: the message names the extra to install (the CLI exits 2)."""


def require_extra(extra: str, packages: Iterable[str], what: str) -> None:
    """:class:`MissingExtraError` naming ``extra`` unless every module of ``packages`` imports."""
    import importlib

    packages = list(packages)
    missing = []
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtraError(
            f"{what} needs the optional packages {', '.join(packages)} ({', '.join(missing)} not installed): "
            f'pip install "eqvit[{extra}]"'
        )


def flop_counter(**kwargs):
    """``torch.utils.flop_counter.FlopCounterMode(**kwargs)`` that also counts the in-place ``addmm_``, which torch's
    table leaves out: eqvit's lean Fourier MLP writes its changes of basis into its row buffer with it."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    def addmm_flops(self_shape, a_shape, b_shape, *args, **kwargs) -> int:  # 2 per multiply-add, as torch's mm
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]

    return FlopCounterMode(custom_mapping={torch.ops.aten.addmm_: addmm_flops}, **kwargs)
