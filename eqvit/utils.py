"""Small helpers shared across eqvit (no torch.nn)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
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
