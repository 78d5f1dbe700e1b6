"""Data efficiency of O(2)-subgroup ViTs on rotated MNIST (the seed's Figure 4, on MNIST).

Square grid: D4, C4, D2, C1 (28^2 digits padded to 32^2, 4^2 patches); hexagonal grid: D6, C6, D3,
C1 (the digits resampled bilinearly onto ``HexPatchGrid(4, 5)``). For every group the number of
regular copies is chosen so that the parameter count is closest to each target, then each model is
trained on ``sample_ratio`` of the 4,000 training digits (0.1 and 1.0) for several seeds (coupled
attention, 3 heads, depth 6, AdamW as in App. F). Writes JSON (accuracy per run) and an
accuracy-vs-log10(params) plot per grid and ratio.

Usage: ``python benchmarks/o2_data_efficiency.py [--seeds 0 1 2] [--epochs 30] [--smoke]``.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--grids", nargs="+", default=["square", "hex"])
    parser.add_argument("--smoke", action="store_true", help="one seed, one epoch, depth 1, 1%% of the data")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "o2_data_efficiency"))
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.epochs, args.depth, args.ratios, args.targets = [0], 1, 1, [0.01], [5_000]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for grid in args.grids:
        for ratio in args.ratios:
            for seed in args.seeds:
                data = rotated_mnist(ratio, seed=seed, img_size=32)
                if grid == "hex":
                    to_hex = SquareToHex(32, HexPatchGrid(*HEX_GRID).points)
                    data = {k: (to_hex(x), y) for k, (x, y) in data.items()}
                for group in GROUPS[grid]:
                    for target in args.targets:
                        copies, params = matched_copies(grid, group, target, args.depth)
                        torch.manual_seed(seed)
                        model = build(grid, group, copies, args.depth)
                        start = time.perf_counter()
                        _, history = fit_classifier(model, data["train"], data["val"], epochs=args.epochs, seed=seed)
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
                                seconds=time.perf_counter() - start,
                            )
                        )
                        print(json.dumps(runs[-1]))
                        (out / "runs.json").write_text(json.dumps(runs, indent=2))
    plot(runs, out)


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
                ys = [100 * np.mean([r["accuracy"] for r in sel if r["target"] == t]) for t in targets]
                ax.plot(xs, ys, "o-", label=group)
            ax.set_title(f"{grid}, sample ratio {ratio}")
            ax.set_xlabel("log10(#params)")
            ax.set_ylabel("validation accuracy (%)")
            ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_params.png", dpi=120)
    print(f"wrote {out / 'runs.json'} and {out / 'accuracy_vs_params.png'}")


if __name__ == "__main__":
    main()
