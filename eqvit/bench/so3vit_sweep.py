"""The SO(3)-RoPE seed's grid search (Sec. 4.1, Fig. 2): SO3ViT error against time per epoch.

The seed trains every combination of depth [4, 8, 16, 32, 64], heads [1, 2, 4, 8] and width
[128, 256, 512] for 100 epochs on an A100 and plots the l2 error of the next step against the
median epoch time. ``--full`` is that grid (for a GPU, with ``--minutes`` as the budget per cell);
the default is a CPU-sized grid (depth [2, 4] x heads [2, 4] x width [64, 128], 0.75 min each) so
that the whole sweep runs in minutes. Every cell trains the main job's model
(``configs/so3vit_swe_demo.yaml``: latitude encoding, residual) on the same shallow-water stream
for the same wall-clock budget, interleaved in rounds so that machine load hits all cells alike,
and is scored on the same validation simulations.

Time per epoch: the stream has no epochs, so an epoch is ``--epoch-samples`` training samples
(default 256) and its time is the measured median seconds per step times the steps it takes.
A cell whose model does not fit (memory) is recorded with its error and skipped.

Writes ``so3vit_sweep.json``, ``pareto.png`` (error vs time per epoch, Pareto front marked) and a
table. Usage::

    python benchmarks/so3vit_sweep.py                 # CPU-sized default
    python benchmarks/so3vit_sweep.py --full --minutes 30 --device cuda
    python benchmarks/so3vit_sweep.py --quick         # smoke test (tiny input, 2 steps a cell)
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import torch

from eqvit.bench._paths import config_path, results_dir

SEED_GRID = {"depth": [4, 8, 16, 32, 64], "heads": [1, 2, 4, 8], "width": [128, 256, 512]}
CPU_GRID = {"depth": [2, 4], "heads": [2, 4], "width": [64, 128]}
QUICK_GRID = {"depth": [1], "heads": [1, 2], "width": [32]}
QUICK_MODEL = {"input_level": 3, "patch_level": 1}  # 642 vertices, 240 tokens


def cells(grid: dict[str, list[int]]) -> list[dict[str, int]]:
    """Every (depth, heads, width) of the grid whose width splits into the heads."""
    out = []
    for depth, heads, width in itertools.product(grid["depth"], grid["heads"], grid["width"]):
        if width % heads == 0:
            out.append({"depth": depth, "heads": heads, "width": width})
    return out


def label(cell: dict[str, int]) -> str:
    return f"{cell['depth']}x{cell['width']}h{cell['heads']}"


def pareto_front(rows: list[dict[str, Any]], x: str = "epoch_seconds", y: str = "rel_l2") -> list[str]:
    """Labels of the rows not dominated in (``x``, ``y``), both smaller-is-better, ordered by ``x``."""
    ok = sorted((r for r in rows if r.get(y) is not None), key=lambda r: (r[x], r[y]))
    front, best = [], float("inf")
    for r in ok:
        if r[y] < best:
            front.append(r["label"])
            best = r[y]
    return front


def plot_pareto(
    rows: list[dict[str, Any]], front: list[str], persistence: float | None, path: Path, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    widths = sorted({r["width"] for r in rows})
    markers = dict(zip(sorted({r["depth"] for r in rows}), "osD^v<>p"))
    cmap = plt.get_cmap("viridis", max(len(widths), 2))
    for r in rows:
        if r.get("rel_l2") is None:
            continue
        ax.scatter(
            r["epoch_seconds"],
            r["rel_l2"],
            color=cmap(widths.index(r["width"])),
            marker=markers[r["depth"]],
            s=25 + 12 * r["heads"],
            edgecolors="k" if r["label"] in front else "none",
            linewidths=1.2,
            zorder=3,
        )
        ax.annotate(
            r["label"], (r["epoch_seconds"], r["rel_l2"]), fontsize=6, xytext=(3, 3), textcoords="offset points"
        )
    pts = sorted((r["epoch_seconds"], r["rel_l2"]) for r in rows if r["label"] in front)
    if pts:
        ax.step(*zip(*pts), where="post", color="k", lw=0.8, ls="--", label="Pareto front")
    if persistence is not None:
        ax.axhline(persistence, color="r", lw=0.8, ls=":", label="persistence")
    for w in widths:
        ax.scatter([], [], color=cmap(widths.index(w)), label=f"width {w}")
    for d, m in markers.items():
        ax.scatter([], [], color="0.5", marker=m, label=f"depth {d}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time per epoch [s] (marker size: heads)")
    ax.set_ylabel("validation relative L2 (next step)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def table(rows: list[dict[str, Any]], front: list[str]) -> str:
    head = f"{'cell':<14} {'params':>8} {'L':>3} {'steps':>6} {'s/step':>7} {'s/epoch':>8}"
    lines = [f"{head} {'rel L2':>8} {'rel L1':>8}  front"]
    for r in sorted(rows, key=lambda r: (r["width"], r["depth"], r["heads"])):
        if r.get("error"):
            lines.append(f"{r['label']:<14} skipped: {r['error']}")
            continue
        lines.append(
            f"{r['label']:<14} {r['params'] / 1e6:>7.2f}M {r['rope_degree']:>3} {r['steps']:>6} "
            f"{r['seconds_per_step']:>7.2f} {r['epoch_seconds']:>8.1f} {r['rel_l2']:>8.4f} {r['rel_l1']:>8.4f}"
            f"  {'*' if r['label'] in front else ''}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="the seed's grid: depth 4..64 x heads 1..8 x width 128..512")
    p.add_argument(
        "--quick", action="store_true", help="smoke test: a tiny grid on a level-3 icosphere, 2 steps a cell"
    )
    p.add_argument("--minutes", type=float, default=None, help="training minutes per cell (default 0.75)")
    p.add_argument("--max-steps", type=int, default=None, help="also stop each cell after N steps")
    p.add_argument("--epoch-samples", type=int, default=256, help="training samples that make one epoch")
    p.add_argument("--num-val", type=int, default=None, help="validation simulations (default 8, quick 2)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: the config's)")
    p.add_argument("--slice", type=float, default=20.0, help="seconds per cell per interleaved round")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--out", type=Path, default=results_dir() / "so3vit_sweep", help="output folder")
    args = p.parse_args(argv)
    if args.full and args.quick:
        p.error("--full and --quick exclude each other")
    if args.minutes is None:
        args.minutes = 0.75
    if args.quick and args.max_steps is None:
        args.max_steps = 2
    if args.num_val is None:
        args.num_val = 2 if args.quick else 8
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    from eqvit.nn.posenc.so3rope import max_order_for
    from eqvit.train.config import load_config
    from eqvit.train.engine import Trainer

    grid = SEED_GRID if args.full else QUICK_GRID if args.quick else CPU_GRID
    base = load_config(config_path("so3vit_swe_demo.yaml"))
    base.data.num_val = args.num_val
    base.train.eval_every = 0
    if args.device is not None:
        base.train.device = args.device
    kwargs0 = dict(base.model.kwargs, **(QUICK_MODEL if args.quick else {}))
    load_start = os.getloadavg()
    trainers: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    for cell in cells(grid):
        name = label(cell)
        cfg = copy.deepcopy(base)
        cfg.model.kwargs = dict(kwargs0, depth=cell["depth"], embed_dim=cell["width"], num_heads=cell["heads"])
        rows[name] = dict(cell, label=name, rope_degree=max_order_for(cell["width"] // cell["heads"]))
        try:
            trainer = Trainer(cfg, out_dir=args.out / "runs" / name, progress=False)
            trainer.start(max_steps=args.max_steps, max_minutes=args.minutes)
            trainers[name] = trainer
        except (RuntimeError, MemoryError) as err:  # out of memory, as the seed skips those
            rows[name]["error"] = str(err).splitlines()[0][:200]
    round_ = 0
    failed: set[str] = set()
    while not all(t.done or n in failed for n, t in trainers.items()):
        round_ += 1
        for name, trainer in trainers.items():
            if trainer.done or name in failed:
                continue
            try:
                trainer.train_for(args.slice)
            except (RuntimeError, MemoryError) as err:
                rows[name]["error"] = str(err).splitlines()[0][:200]
                failed.add(name)
        print(f"round {round_}: " + ", ".join(f"{n} {t.step}" for n, t in trainers.items()), flush=True)
    persistence = None
    for name, trainer in trainers.items():
        if rows[name].get("error"):
            continue
        summary = trainer.finish()
        steps = [row["time_s"] for row in trainer.history.train]
        step_s = statistics.median(b - a for a, b in itertools.pairwise(steps)) if len(steps) > 2 else None
        step_s = step_s or summary["seconds_per_step"]
        rows[name].update(
            params=summary["params"],
            steps=summary["steps"],
            seconds_per_step=step_s,
            epoch_seconds=step_s * args.epoch_samples / base.data.batch_size,
            rel_l2=summary["metrics"]["rel_l2"],
            rel_l1=summary["metrics"]["rel_l1"],
            polar_error_ratio=summary["metrics"]["polar_error_ratio"],
        )
        persistence = summary["persistence"]["rel_l2"]
    done = [r for r in rows.values() if not r.get("error")]
    front = pareto_front(done)
    result = {
        "grid": "seed" if args.full else "quick" if args.quick else "cpu",
        "axes": grid,
        "minutes_per_cell": args.minutes,
        "max_steps": args.max_steps,
        "epoch_samples": args.epoch_samples,
        "num_val": args.num_val,
        "model_kwargs": kwargs0,
        "persistence_rel_l2": persistence,
        "pareto_front": front,
        "rows": list(rows.values()),
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": base.train.device,
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "so3vit_sweep.json").write_text(json.dumps(result, indent=2))
    title = f"SO3ViT sweep ({result['grid']} grid, {args.minutes:g} min a cell, {args.num_val} validation simulations)"
    plot_pareto(done, front, persistence, args.out / "pareto.png", title)
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    result = run(args)
    print(table(result["rows"], result["pareto_front"]))
    m = result["machine"]
    print(
        f"persistence rel L2 {result['persistence_rel_l2']:.4f}; load average "
        f"{m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}"
    )
    print(f"wrote {args.out / 'so3vit_sweep.json'} and {args.out / 'pareto.png'}")


if __name__ == "__main__":
    main()
