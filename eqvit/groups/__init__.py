"""The group-theory core: finite groups, real irreps, homogeneous spaces, SO(3).

``get_group(name)`` accepts ``"C{n}"``, ``"D{n}"`` (n >= 1), ``"T"``, ``"O"``, ``"I"``,
``"trivial"`` and any name added with :func:`register_group`; groups are cached, so
construction cost is paid once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from eqvit.groups.base import FiniteGroup
from eqvit.groups.homogeneous import HomogeneousSpace
from eqvit.groups.irreps import Irrep, Representation
from eqvit.groups.planar import cyclic, dihedral
from eqvit.groups.platonic import icosahedral, octahedral, tetrahedral

__all__ = [
    "FiniteGroup",
    "HomogeneousSpace",
    "Irrep",
    "Representation",
    "cyclic",
    "dihedral",
    "get_group",
    "icosahedral",
    "list_groups",
    "octahedral",
    "register_group",
    "resolve_group",
    "tetrahedral",
]

_PLATONIC = {"T": tetrahedral, "O": octahedral, "I": icosahedral}
_USER_GROUPS: dict[str, Callable[[], FiniteGroup]] = {}
VALID_FORMS = ["C{n}", "D{n}", "T", "O", "I", "trivial"]


@cache
def get_group(name: str) -> FiniteGroup:
    """The finite group called ``name``: ``"C{n}"``, ``"D{n}"`` (n >= 1), ``"T"``, ``"O"``, ``"I"``, ``"trivial"``."""
    if not isinstance(name, str):
        raise ValueError(f"expected a group name (str), got {type(name).__name__}")
    if name == "trivial":
        return get_group("C1")
    if name in _PLATONIC:
        return _PLATONIC[name]()
    if name in _USER_GROUPS:
        group = _USER_GROUPS[name]()
        if not isinstance(group, FiniteGroup):
            raise ValueError(f"the factory registered for {name!r} returned {type(group).__name__}, not a FiniteGroup")
        return group
    match = re.fullmatch(r"([CD])([1-9]\d*)", name)
    if match is None:
        import difflib

        valid = list_groups() + ["trivial"] + list(_USER_GROUPS)
        by_upper = {v.upper(): v for v in valid}
        close = difflib.get_close_matches(name.upper(), list(by_upper), n=1)
        hint = f" Did you mean {by_upper[close[0]]!r}?" if close else ""
        extra = f", or a registered group: {', '.join(sorted(_USER_GROUPS))}" if _USER_GROUPS else ""
        raise ValueError(f"unknown group {name!r}.{hint} Valid forms: {', '.join(VALID_FORMS)} (n >= 1){extra}")
    n = int(match.group(2))
    return cyclic(n) if match.group(1) == "C" else dihedral(n)


def resolve_group(group: str | FiniteGroup) -> FiniteGroup:
    """``group`` itself, or :func:`get_group` of its name (built-in or registered with :func:`register_group`)."""
    return group if isinstance(group, FiniteGroup) else get_group(group)


def list_groups(max_n: int = 8) -> list[str]:
    """Names of the commonly used groups: C1..C{max_n}, D1..D{max_n}, T, O, I."""
    return [f"C{n}" for n in range(1, max_n + 1)] + [f"D{n}" for n in range(1, max_n + 1)] + ["T", "O", "I"]


def register_group(name: str, factory: Callable[[], FiniteGroup]) -> None:
    """Make ``get_group(name)`` build ``factory()`` (once; the result is cached).

    The factory returns a :class:`FiniteGroup` of orthogonal matrices, e.g. from generators with
    :func:`eqvit.groups.base.close_under_multiplication`; its real irreps are then found by the
    numerical decomposition of the regular representation. Built-in names cannot be replaced.
    """
    builtin = name in _PLATONIC or name == "trivial" or re.fullmatch(r"[CD][1-9]\d*", name) is not None
    if builtin:
        raise ValueError(f"{name!r} is a built-in group name; choose another")
    if name in _USER_GROUPS and _USER_GROUPS[name] is not factory:
        raise ValueError(f"a group called {name!r} is already registered")
    _USER_GROUPS[name] = factory
    get_group.cache_clear()
