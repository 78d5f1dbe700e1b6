"""Data efficiency of O(2)-subgroup ViTs on rotated MNIST (the seed's Figure 4, on MNIST).

Square grid: D4, C4, D2, C1 (28^2 digits padded to 32^2, 4^2 patches); hexagonal grid: D6, C6, D3,
C1 (the digits resampled bilinearly onto ``HexPatchGrid(4, 5)``). For every group the number of
regular copies is chosen so that the parameter count is closest to each target, then each model is
trained on ``sample_ratio`` of the 4,000 training digits (0.1 and 1.0) for several seeds (coupled
attention, 3 heads, depth 6, AdamW as in App. F), keeping the epoch of best validation accuracy
(early stopping). Writes JSON (``runs.json``: accuracy per run; ``summary.json``: mean and std over
seeds per grid, group, ratio and target, and the gap of each group to C1) and an
accuracy-vs-log10(params) plot per grid and ratio.

Usage: ``python benchmarks/o2_data_efficiency.py [--seeds 0 1 2] [--epochs 30] [--smoke]``; a cheaper
subset: ``--grids square --groups D4 C1 --targets 20000 --epochs 150 25`` (one epoch count per ratio).
``--resume`` skips the runs already in ``runs.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

import eqvit
from eqvit.data.images import SquareToHex, rotated_mnist
from eqvit.geometry import HexPatchGrid
from eqvit.train.classify import fit_classifier

GROUPS = {"square": ["D4", "C4", "D2", "C1"], "hex": ["D6", "C6", "D3", "C1"]}
HEX_GRID = (4, 5)


def build(grid: str, group: str, copies: int, depth: int) -> torch.nn.Module:
    common = dict(group=group, regular_copies=copies, depth=depth, num_heads=3, in_chans=1, num_classes=10)
    if grid == "square":
        return eqvit.create_model("o2vit_square_s", img_size=32, patch_size=4, **common)
    return eqvit.create_model("o2vit_hex_s", n_patch_side=HEX_GRID[0], n_pixel_side=HEX_GRID[1], **common)


def matched_copies(grid: str, group: str, target: int, depth: int) -> tuple[int, int]:
    """Regular copies (a multiple of 3, one per head) whose parameter count is closest to ``target``."""
    best = None
    for copies in range(3, 97, 3):
        n = sum(p.numel() for p in build(grid, group, copies, depth).parameters())
        if best is None or abs(np.log(n / target)) < abs(np.log(best[1] / target)):
            best = (copies, n)
        if n > 2 * target:
            break
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--targets", type=int, nargs="+", default=[20_000, 60_000])
    parser.add_argument(
        "--epochs", type=int, nargs="+", default=[30], help="maximum epochs: one value, or one per --ratios entry"
    )
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--grids", nargs="+", default=["square", "hex"], choices=list(GROUPS))
    parser.add_argument(
        "--groups", nargs="+", default=None, help="subset of each grid's groups, in this order (default: all)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--eval-every", type=int, nargs="+", default=[1], help="validation every N epochs: one value or one per ratio"
    )
    parser.add_argument("--patience", type=int, default=None, help="early stopping: epochs without a new best")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--resume", action="store_true", help="skip the runs already in OUT/runs.json")
    parser.add_argument(
        "--report-only", action="store_true", help="only rewrite summary.json and the plot from OUT/runs.json"
    )
    parser.add_argument("--smoke", action="store_true", help="one seed, one epoch, depth 1, 1%% of the data")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "o2_data_efficiency"))
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.epochs, args.depth, args.ratios, args.targets = [0], [1], 1, [0.01], [5_000]

    def per_ratio(name: str, values: list[int]) -> dict[float, int]:
        if len(values) not in (1, len(args.ratios)):
            parser.error(f"--{name} takes one value or one per ratio ({len(args.ratios)}), got {values}")
        return dict(zip(args.ratios, values * len(args.ratios) if len(values) == 1 else values))

    epochs_at, eval_every_at = per_ratio("epochs", args.epochs), per_ratio("eval-every", args.eval_every)
    for grid in args.grids:
        unknown = [g for g in args.groups or [] if g not in GROUPS[grid]]
        if unknown:
            parser.error(f"--groups {unknown} are not in the {grid} grid's family {GROUPS[grid]}")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    invocation = {k: v for k, v in vars(args).items() if k not in ("out", "resume", "smoke", "report_only")} | {
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "torch": torch.__version__,
    }
    previous = json.loads((out / "runs.json").read_text()) if (out / "runs.json").is_file() else {}
    if args.report_only:
        report(previous["runs"], previous["settings"], out)
        return
    runs, settings = [], [invocation]
    if args.resume and previous:
        runs = previous["runs"]
        earlier = previous["settings"]
        settings = (earlier if isinstance(earlier, list) else [earlier]) + [invocation]
    done = {(r["grid"], r["group"], r["ratio"], r["seed"], r["target"]) for r in runs}
    wall = time.perf_counter()
    for grid in args.grids:
        for ratio in args.ratios:
            for seed in args.seeds:
                data = None
                for group in args.groups or GROUPS[grid]:
                    for target in args.targets:
                        if (grid, group, ratio, seed, target) in done:
                            continue
                        if data is None:
                            data = rotated_mnist(ratio, seed=seed, img_size=32)
                            if grid == "hex":
                                to_hex = SquareToHex(32, HexPatchGrid(*HEX_GRID).points)
                                data = {k: (to_hex(x), y) for k, (x, y) in data.items()}
                        copies, params = matched_copies(grid, group, target, args.depth)
                        torch.manual_seed(seed)
                        model = build(grid, group, copies, args.depth)
                        start = time.perf_counter()
                        _, history = fit_classifier(
                            model,
                            data["train"],
                            data["val"],
                            epochs=epochs_at[ratio],
                            batch_size=args.batch_size,
                            lr=args.lr,
                            patience=args.patience,
                            eval_every=eval_every_at[ratio],
                            seed=seed,
                        )
                        runs.append(
                            dict(
                                grid=grid,
                                group=group,
                                ratio=ratio,
                                seed=seed,
                                target=target,
                                copies=copies,
                                params=params,
                                accuracy=history.best_accuracy,
                                best_epoch=history.best_epoch + 1,
                                epochs=history.epochs,
                                max_epochs=epochs_at[ratio],
                                train_size=len(data["train"][1]),
                                batch_size=args.batch_size,
                                lr=args.lr,
                                seconds=time.perf_counter() - start,
                            )
                        )
                        print(json.dumps(runs[-1]), flush=True)
                        write_runs(runs, settings, out)
    print(f"wall time {time.perf_counter() - wall:.0f} s for {len(runs) - len(done)} runs")
    write_runs(runs, settings, out)
    report(runs, settings, out)


def report(runs: list[dict], settings: list[dict] | dict, out: Path) -> None:
    summary = summarise(runs)
    (out / "summary.json").write_text(json.dumps({"settings": settings, "summary": summary}, indent=2))
    print_summary(summary)
    plot(runs, out)


def write_runs(runs: list[dict], settings: list[dict] | dict, out: Path) -> None:
    (out / "runs.json").write_text(json.dumps({"settings": settings, "runs": runs}, indent=2))


def summarise(runs: list[dict]) -> list[dict]:
    """Mean / std (over seeds, ddof 1) of accuracy per grid, group, ratio and target; gap to C1 in points."""
    keys = sorted(
        {(r["grid"], r["ratio"], r["target"], r["group"]) for r in runs},
        key=lambda k: (k[0], k[1], k[2], GROUPS[k[0]].index(k[3])),
    )
    rows = []
    for grid, ratio, target, group in keys:
        sel = [r for r in runs if (r["grid"], r["ratio"], r["target"], r["group"]) == (grid, ratio, target, group)]
        acc = 100 * np.array([r["accuracy"] for r in sel])
        rows.append(
            dict(
                grid=grid,
                group=group,
                ratio=ratio,
                target=target,
                params=sel[0]["params"],
                copies=sel[0]["copies"],
                seeds=[r["seed"] for r in sel],
                accuracy_mean=float(acc.mean()),
                accuracy_std=float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                epochs_mean=float(np.mean([r["epochs"] for r in sel])),
                best_epoch_mean=float(np.mean([r["best_epoch"] for r in sel])),
                seconds_mean=float(np.mean([r["seconds"] for r in sel])),
            )
        )
    for row in rows:
        base = [
            b
            for b in rows
            if b["group"] == "C1" and (b["grid"], b["ratio"], b["target"]) == (row["grid"], row["ratio"], row["target"])
        ]
        row["gap_to_C1_points"] = row["accuracy_mean"] - base[0]["accuracy_mean"] if base else None
    return rows


def print_summary(rows: list[dict]) -> None:
    print(
        f"{'grid':<7} {'ratio':>5} {'target':>7} {'group':<5} {'params':>7} {'seeds':>5} {'accuracy (%)':>14} "
        f"{'vs C1':>6} {'epochs':>6} {'best ep':>7} {'s/run':>6}"
    )
    for r in rows:
        gap = f"{r['gap_to_C1_points']:+.1f}" if r["gap_to_C1_points"] is not None else ""
        print(
            f"{r['grid']:<7} {r['ratio']:>5} {r['target']:>7} {r['group']:<5} {r['params']:>7} {len(r['seeds']):>5} "
            f"{r['accuracy_mean']:>7.2f} ± {r['accuracy_std']:<4.2f} {gap:>6} {r['epochs_mean']:>6.0f} "
            f"{r['best_epoch_mean']:>7.0f} {r['seconds_mean']:>6.0f}"
        )


def plot(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grids = sorted({r["grid"] for r in runs})
    ratios = sorted({r["ratio"] for r in runs})
    fig, axes = plt.subplots(len(grids), len(ratios), figsize=(5 * len(ratios), 4 * len(grids)), squeeze=False)
    for i, grid in enumerate(grids):
        for j, ratio in enumerate(ratios):
            ax = axes[i][j]
            for group in GROUPS[grid]:
                sel = [r for r in runs if r["grid"] == grid and r["ratio"] == ratio and r["group"] == group]
                if not sel:
                    continue
                targets = sorted({r["target"] for r in sel})
                xs = [np.log10(np.mean([r["params"] for r in sel if r["target"] == t])) for t in targets]
                accs = [100 * np.array([r["accuracy"] for r in sel if r["target"] == t]) for t in targets]
                ys = [a.mean() for a in accs]
                err = [a.std(ddof=1) if len(a) > 1 else 0.0 for a in accs]
                ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, label=group)
            ax.set_title(f"{grid}, sample ratio {ratio}")
            ax.set_xlabel("log10(#params)")
            ax.set_ylabel("best validation accuracy (%), mean ± std over seeds")
            ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_params.png", dpi=120)
    print(f"wrote {out / 'runs.json'} and {out / 'accuracy_vs_params.png'}")


if __name__ == "__main__":
    main()
