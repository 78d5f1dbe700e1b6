"""Files eqvit derives once and keeps (parsed datasets, fixed validation sets): written safely, read warily.

A cache is written with :func:`eqvit.utils.atomic_write` (a temporary of its own, renamed: processes
building the same cache at once do not collide, and a reader never sees half a file), with the
umask's mode, so a cache folder shared by a group stays readable by it. Reading verifies what was
written (its keys and a SHA-256 of its contents); a file that fails is reported once as a warning,
removed and built again, never a traceback.

    arrays = cached(path, load, build, save, "QM9")
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import numpy as np

T = TypeVar("T")


class CorruptCacheError(ValueError):
    """A cache file that cannot be read back as written (truncated, damaged, from another version)."""


def digest(arrays: Iterable[tuple[str, np.ndarray]]) -> str:
    """SHA-256 over ``(name, dtype, shape, bytes)`` of each array, in the given order."""
    h = hashlib.sha256()
    for name, array in arrays:
        array = np.ascontiguousarray(array)
        h.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def cached(
    path: Path, load: Callable[[Path], T], build: Callable[[], T], save: Callable[[Path, T], None], what: str
) -> T:
    """``load(path)`` when the cache is there and sound; else ``build()``, ``save(path, value)`` and the value.

    ``load`` raises :class:`CorruptCacheError` for a file it cannot verify: the file is then removed
    and rebuilt, with one warning naming it and the reason.
    """
    if path.is_file():
        try:
            return load(path)
        except CorruptCacheError as err:
            warnings.warn(f"the {what} cache {path} is unreadable ({err}); building it again", stacklevel=3)
            path.unlink(missing_ok=True)
    value = build()
    save(path, value)
    return value
