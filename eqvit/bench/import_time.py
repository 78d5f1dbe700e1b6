"""Start-up cost: ``import eqvit`` and ``eqvit list`` against ``import torch, timm``.

Every measurement is a fresh interpreter, timed from outside (``time.perf_counter`` around
``subprocess.run``), so it is the wall time a user waits for, interpreter start included. The
cases run in interleaved rounds whose order rotates from one round to the next, so that load from
other jobs on a shared machine hits all of them alike; one untimed warm-up round first fills the
file cache. Reported per case: the median and minimum wall time, and the median over rounds of the
ratio to ``import torch, timm`` in the same round; the same for the child's CPU time (user +
system), which load from other jobs disturbs less. Targets: ``import eqvit`` and ``eqvit list``
at most 1.25x ``import torch, timm`` (eqvit registers its models in timm's registry, so timm is
always loaded; torch-harmonics and the other optional extras load on first use).

The children import this checkout's eqvit (its root is put first on ``PYTHONPATH``, which the
console script ``eqvit`` beside the interpreter also honours; it is timed when present). The
parent imports only the standard library. Writes JSON and prints a table.

Usage: ``python benchmarks/import_time.py [--rounds 9] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from eqvit.bench._paths import results_dir

ROOT = Path(__file__).resolve().parents[2]  # the folder holding this eqvit package
BASELINE = "import torch, timm"
TARGET = 1.25
# Optional modules that `import eqvit` must leave unloaded (checked once, untimed).
LAZY = ("torch_harmonics", "scipy", "networkx", "matplotlib", "sklearn", "pandas", "mlxtend", "tensorboard")


def child_env() -> dict[str, str]:
    """The environment with this checkout first on PYTHONPATH (also for the console script)."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def cases() -> dict[str, list[str]]:
    """Name -> command line of each timed case."""
    py = sys.executable
    out = {
        "python -c pass": [py, "-c", "pass"],
        BASELINE: [py, "-c", BASELINE],
        "import eqvit": [py, "-c", "import eqvit"],
        "python -m eqvit list": [py, "-m", "eqvit", "list"],
    }
    script = Path(py).parent / "eqvit"
    if script.is_file():
        out["eqvit list (console script)"] = [str(script), "list"]
    return out


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one fresh process running ``cmd``."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr}")
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return elapsed, cpu


def check_children(env: dict[str, str]) -> dict:
    """Which eqvit the children import, and which optional modules ``import eqvit`` loads (untimed)."""
    code = f"import json, sys, eqvit; print(json.dumps([eqvit.__file__, [m for m in {LAZY!r} if m in sys.modules]]))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    eqvit_file, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"eqvit_file": eqvit_file, "optional_modules_loaded_by_import_eqvit": loaded}


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (each runs every case once)")
    parser.add_argument("--out", default=str(results_dir() / "import_time.json"))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")

    env = child_env()
    commands = cases()
    names = list(commands)
    load_start = os.getloadavg()
    children = check_children(env)
    for name in names:  # warm-up round: file cache, .pyc files
        run_once(commands[name], env)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    load_per_round = []
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotating order
            w, c = run_once(commands[name], env)
            wall[name].append(w)
            cpu[name].append(c)
        load_per_round.append(os.getloadavg()[0])
    load_end = os.getloadavg()

    def median_ratio(times: dict[str, list[float]], name: str) -> float:
        return statistics.median(t / b for t, b in zip(times[name], times[BASELINE], strict=True))

    rows = []
    for name in names:
        target = TARGET if name not in ("python -c pass", BASELINE) else None
        ratio = median_ratio(wall, name)
        rows.append(
            {
                "case": name,
                "command": commands[name],
                "median_s": statistics.median(wall[name]),
                "min_s": min(wall[name]),
                "median_ratio_vs_torch_timm": ratio,
                "target_ratio": target,
                "meets_target": None if target is None else ratio <= target,
                "median_cpu_s": statistics.median(cpu[name]),
                "median_cpu_ratio_vs_torch_timm": median_ratio(cpu, name),
                "wall_s": wall[name],
                "cpu_s": cpu[name],
            }
        )

    header = (
        f"{'case (fresh process)':<30} {'median s':>9} {'min s':>7} {'ratio':>7} {'target':>7}    "
        f"{'cpu s':>6} {'cpu ratio':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        target = "" if row["target_ratio"] is None else f"<={row['target_ratio']:.2f}"
        mark = {None: "", True: "ok", False: "MISSED"}[row["meets_target"]]
        print(
            f"{row['case']:<30} {row['median_s']:>9.2f} {row['min_s']:>7.2f} "
            f"{row['median_ratio_vs_torch_timm']:>6.2f}x {target:>7} {mark:<6} "
            f"{row['median_cpu_s']:>6.2f} {row['median_cpu_ratio_vs_torch_timm']:>8.2f}x"
        )
    print(
        f"{args.rounds} interleaved rounds; ratio = median over rounds of wall time / wall time of `{BASELINE}` "
        "in the same round (cpu: the same for user + system CPU time, less sensitive to load)"
    )
    print(f"load average (1, 5, 15 min): start {load_start}, end {load_end}")
    print(
        f"eqvit from {children['eqvit_file']}; optional modules loaded by `import eqvit`: "
        f"{children['optional_modules_loaded_by_import_eqvit'] or 'none'}"
    )

    meta = {
        "rounds": args.rounds,
        "warmup_rounds": 1,
        "load_avg_start": load_start,
        "load_avg_end": load_end,
        "load_avg_1min_per_round": load_per_round,
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": version("torch"),
        "timm": version("timm"),
        "torch_harmonics": version("torch-harmonics"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        **children,
        "note": (
            "wall time of fresh processes timed from the parent (interpreter start included), and their user + "
            "system CPU time (getrusage of the children); interleaved rounds in rotating order after one warm-up "
            f"round; ratio = median over rounds of time / time of `{BASELINE}` in the same round; the target is "
            "on the wall-time ratio"
        ),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
