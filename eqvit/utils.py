"""Small helpers shared across eqvit (no torch.nn)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def unknown_name_error(kind: str, name: str, valid: Iterable[str]) -> ValueError:
    """A ValueError for an unknown ``name`` that lists the valid ones and the closest match."""
    valid = list(valid)
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    shown = ", ".join(valid[:40]) + (", ..." if len(valid) > 40 else "")
    return ValueError(f"unknown {kind} {name!r}.{hint} Valid: {shown}")
