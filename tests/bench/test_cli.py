"""``eqvit bench``: the benchmarks are package code, so listing and running them needs no ``benchmarks/`` folder."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

import eqvit
from eqvit import bench
from eqvit.cli import main

PACKAGE = Path(eqvit.__file__).resolve().parent


def test_every_benchmark_is_a_package_module_with_a_main():
    modules = {p.stem for p in (PACKAGE / "bench").glob("*.py") if not p.stem.startswith("_")}
    assert set(bench.list_benchmarks()) == modules
    for name in bench.list_benchmarks():
        tree = ast.parse((PACKAGE / "bench" / f"{name}.py").read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), name


def test_scripts_are_thin_drivers_that_import_only_eqvit():
    """benchmarks/NAME.py calls eqvit.bench.NAME:main and imports nothing but eqvit (no sys.path tricks)."""
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts == set(bench.SCRIPTS.values())
    for name, script in bench.SCRIPTS.items():
        tree = ast.parse((ROOT / "benchmarks" / f"{script}.py").read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert [(n.module, [a.name for a in n.names]) for n in imports] == [(f"eqvit.bench.{name}", ["main"])]


def test_bench_lists_without_importing_the_benchmarks(capsys):
    before = set(sys.modules)
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in bench.list_benchmarks())
    assert not any(m.startswith("eqvit.bench.") and m != "eqvit.bench._paths" for m in set(sys.modules) - before)


def test_bench_unknown_name_lists_the_valid_ones(capsys):
    assert main(["bench", "o2_sped"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'o2_sped'" in err and "o2_speed" in err


def test_bench_help_runs_from_the_package_outside_the_checkout(tmp_path):
    """From another folder, with only eqvit's parent on the path: the module run is inside the package."""
    code = (
        "import sys, eqvit.bench as b; m = b.load('groups_timing'); print(m.__file__); "
        "from eqvit.cli import main; sys.exit(main(['bench', 'groups_timing', '--help']))"
    )
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    first, rest = proc.stdout.split("\n", 1)
    assert Path(first).resolve().is_relative_to(PACKAGE / "bench")
    assert "usage: eqvit bench groups_timing" in rest and "--repeats" in rest


@pytest.mark.parametrize("name", ["groups_timing", "_device"])
def test_bench_accepts_script_names(name):
    assert bench.load(name).__name__.startswith("eqvit.bench.")
