"""Where the benchmarks read configs and write results, in a checkout and in an installed wheel.

In a source checkout (the folder above the ``eqvit`` package holds ``benchmarks/`` and ``configs/``),
results go to ``benchmarks/results/`` and configs come from ``configs/``, as the README's commands
expect. Installed from a wheel, results go to ``./benchmarks/results/`` under the current folder
(``$EQVIT_BENCH_RESULTS`` overrides both), and a benchmark that needs a config file asks for
``--config``.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def repo_root() -> Path | None:
    """The source checkout this ``eqvit`` was imported from, or ``None`` (an installed wheel)."""
    root = _PACKAGE_PARENT
    return root if (root / "benchmarks").is_dir() and (root / "configs").is_dir() else None


def results_dir() -> Path:
    """The default folder for benchmark results (see the module docstring)."""
    override = os.environ.get("EQVIT_BENCH_RESULTS")
    if override:
        return Path(override)
    root = repo_root()
    return (root if root is not None else Path.cwd()) / "benchmarks" / "results"


def peers_dir() -> Path | None:
    """Where peer code for side-by-side benchmarks lives: ``$EQVIT_PEERS``, else ``../shared/peers`` beside
    the checkout (the project's layout), else ``None`` (a wheel install: the peer columns are skipped)."""
    override = os.environ.get("EQVIT_PEERS")
    if override:
        return Path(override)
    root = repo_root()
    return root.parent / "shared" / "peers" if root is not None else None


def config_path(name: str) -> Path:
    """``configs/NAME`` of the checkout; in a wheel, ``configs/NAME`` under the current folder."""
    root = repo_root()
    return (root if root is not None else Path.cwd()) / "configs" / name


def display_path(path: Path) -> str:
    """``path`` relative to the checkout when inside it (no machine-specific prefixes in JSON)."""
    root = repo_root() or Path.cwd()
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)
