"""Platonic Transformer frames on synthetic point clouds: accuracy under random SO(3) test rotations.

Trivial, T (12), O (24) and I (60) frames at the same total width ``|G| * C`` and depth (the
Platonic seed's equal computational budget), trained on shapes in the orientation chosen by
``--train-rotate`` (:func:`eqvit.data.pointclouds.pointcloud_splits`), with model selection on a
validation set drawn the same way, and tested twice on the same test point sets: Haar-random
SO(3) rotations (``test_rotate="so3"``) and the canonical orientation (``"none"``). Two protocols:

* ``--train-rotate so3`` (default): train on randomly rotated shapes (one fixed rotation per sample). Every
  model must learn invariance to the rotations its frames do not cover from the data; a group of
  frames gives it |G| orientations of each sample for free.
* ``--train-rotate none``: train upright, test rotated. Frames make a model exactly invariant to
  their group only, so this asks how far that finite invariance carries to unseen orientations.

Each seed draws new data (``pointcloud_splits(seed=...)``) and a new initialisation and batch order.
The models take ``(pos, feat)``; :class:`PackedPoints` packs them into one tensor so that
:func:`eqvit.train.classify.fit_classifier` and :func:`~eqvit.train.classify.accuracy` are reused
unchanged. One thread (``torch.set_num_threads(1)``). Writes ``results.json``, ``results.md`` and
``accuracy.png`` into ``--out``.

Usage::

    python benchmarks/platonic_pointcloud.py            # 4 groups x 3 seeds (about 1.5 hours on one core)
    python benchmarks/platonic_pointcloud.py --quick    # CI-sized (under 2 minutes)
    python benchmarks/platonic_pointcloud.py --groups trivial I --seeds 0 1 2 3 4
    python benchmarks/platonic_pointcloud.py --train-rotate none --width 240 --points 64 --epochs 10
    python benchmarks/platonic_pointcloud.py --replot   # redo the table and plot from results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import eqvit
from eqvit.bench._paths import results_dir
from eqvit.data.pointclouds import pointcloud_splits
from eqvit.train.classify import accuracy, fit_classifier

DEFAULT_OUT = results_dir() / "platonic_pointcloud"
GROUPS = ("trivial", "T", "O", "I")
ORIENTATION = {"none": "upright", "so3": "SO(3)-rotated", "z": "rotated about z"}
# What run_one reads: the command-line defaults here, and `ablate.py points` (full run) as they are.
SETTINGS = dict(
    width=480,
    depth=2,
    mlp_ratio=2.0,
    points=32,
    train=1000,
    val=200,
    test=500,
    epochs=30,
    batch=32,
    lr=1e-3,
    train_rotate="so3",
)


class PackedPoints(nn.Module):
    """``x [B, N, 3 + C] -> model(x[..., :3], x[..., 3:])``: a (pos, feat) model on one tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x[..., :3], x[..., 3:])


def pack(split) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([split.pos, split.feat], dim=-1), split.labels


def run_one(group: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    splits = pointcloud_splits(
        args.train,
        args.test,
        args.val,
        num_points=args.points,
        train_rotate=args.train_rotate,
        test_rotate="so3",
        seed=seed,
    )
    # The same test point sets in the canonical orientation (each split has its own seeded stream).
    upright = pointcloud_splits(
        0, args.test, 0, num_points=args.points, train_rotate="none", test_rotate="none", seed=seed
    ).test
    torch.manual_seed(seed)
    net = eqvit.create_model(
        "platonic_points_s",
        group=group,
        embed_dim=args.width,
        depth=args.depth,
        mlp_ratio=args.mlp_ratio,
        num_classes=len(splits.classes),
        num_points=args.points,
    )
    model = PackedPoints(net)
    start = time.perf_counter()
    model, history = fit_classifier(
        model, pack(splits.train), pack(splits.val), epochs=args.epochs, batch_size=args.batch, lr=args.lr, seed=seed
    )
    train_s = time.perf_counter() - start
    row = {
        "group": group,
        "group_order": net.frames.order,
        "seed": seed,
        "channels_per_frame": args.width // net.frames.order,
        "heads_per_frame": net.blocks[0].attn.num_heads,
        "params": sum(p.numel() for p in net.parameters()),
        "train_s": train_s,
        "best_epoch": history.best_epoch,
        "val_accuracy": history.best_accuracy,
        "val_curve": history.val_accuracy,
        "train_loss": history.train_loss,
        "test_so3": accuracy(model, *pack(splits.test)),
        "test_none": accuracy(model, *pack(upright)),
    }
    row["total_s"] = time.perf_counter() - start
    return row


def summarise(rows: list[dict[str, Any]], groups: list[str]) -> dict[str, dict[str, float]]:
    out = {}
    for g in groups:
        mine = [r for r in rows if r["group"] == g]
        if not mine:
            continue
        entry: dict[str, float] = {"seeds": len(mine), "params": mine[0]["params"]}
        for key in ("test_so3", "test_none", "val_accuracy", "train_s"):
            vals = [r[key] for r in mine]
            entry[f"{key}_mean"] = statistics.fmean(vals)
            entry[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out[g] = entry
    return out


def markdown(summary: dict[str, dict[str, float]], meta: dict[str, Any]) -> str:
    lines = [
        "# Platonic frames on synthetic point clouds",
        "",
        f"Train and validate {ORIENTATION[meta['train_rotate']]}, test on the same {meta['test']} test clouds "
        "SO(3)-rotated and upright. "
        f"Width {meta['width']} (= |G| x C), depth {meta['depth']}, MLP ratio {meta['mlp_ratio']}, "
        f"{meta['points']} points, "
        f"{meta['train']} train / {meta['val']} val, {meta['epochs']} epochs, batch {meta['batch']}, "
        f"seeds {meta['seeds']}, one thread. Chance = {1 / meta['num_classes']:.2f}. Mean +- std over seeds.",
        "",
        "| frames | C per frame | params | test SO(3)-rotated | test upright | val | train s / run |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, s in summary.items():
        lines.append(
            f"| {g} | {meta['width'] // meta['orders'][g]} | {s['params']:,} | "
            f"{s['test_so3_mean']:.3f} +- {s['test_so3_std']:.3f} | "
            f"{s['test_none_mean']:.3f} +- {s['test_none_std']:.3f} | "
            f"{s['val_accuracy_mean']:.3f} +- {s['val_accuracy_std']:.3f} | {s['train_s_mean']:.0f} |"
        )
    if "trivial" in summary:
        base = summary["trivial"]["test_so3_mean"]
        beats = [g for g in ("O", "I") if g in summary and summary[g]["test_so3_mean"] > base]
        lines += [
            "",
            f"Target (O and I beat trivial on rotated test shapes): {'met' if len(beats) == 2 else 'not met'} "
            f"(beating trivial: {', '.join(beats) or 'none'}).",
        ]
    lines += ["", f"Wall time {meta['wall_s'] / 60:.1f} min; load average at the end {meta['loadavg_end']}."]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, dict[str, float]], rows: list[dict[str, Any]], path: Path, meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(summary)
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.38
    for i, (key, label, color) in enumerate(
        (("test_none", "upright test", "tab:blue"), ("test_so3", "SO(3)-rotated test", "tab:orange"))
    ):
        xs = [j + (i - 0.5) * width for j in range(len(groups))]
        means = [summary[g][f"{key}_mean"] for g in groups]
        stds = [summary[g][f"{key}_std"] for g in groups]
        ax.bar(xs, means, width, yerr=stds, capsize=4, label=label, color=color, alpha=0.8)
        for j, g in enumerate(groups):  # individual seeds
            vals = [r[key] for r in rows if r["group"] == g]
            ax.scatter([xs[j]] * len(vals), vals, s=10, color="black", zorder=3)
    ax.axhline(1 / meta["num_classes"], color="gray", ls="--", lw=1, label="chance")
    ax.set_xticks(range(len(groups)), [f"{g}\n|G|={meta['orders'][g]}" for g in groups])
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"Platonic frames, width {meta['width']}, depth {meta['depth']}, {len(meta['seeds'])} seeds")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", nargs="+", default=list(GROUPS), choices=list(GROUPS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--width", type=int, default=SETTINGS["width"], help="total width |G| * C (multiple of 2 |G| heads)"
    )
    parser.add_argument("--depth", type=int, default=SETTINGS["depth"])
    parser.add_argument("--mlp-ratio", type=float, default=SETTINGS["mlp_ratio"])
    parser.add_argument("--points", type=int, default=SETTINGS["points"])
    parser.add_argument("--train", type=int, default=SETTINGS["train"])
    parser.add_argument("--val", type=int, default=SETTINGS["val"])
    parser.add_argument("--test", type=int, default=SETTINGS["test"])
    parser.add_argument("--epochs", type=int, default=SETTINGS["epochs"])
    parser.add_argument("--batch", type=int, default=SETTINGS["batch"])
    parser.add_argument("--lr", type=float, default=SETTINGS["lr"])
    parser.add_argument(
        "--train-rotate",
        choices=sorted(ORIENTATION),
        default=SETTINGS["train_rotate"],
        help="orientation of train and validation shapes",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="CI-sized: 2 seeds, tiny data, 2 epochs")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--replot", action="store_true", help="rewrite results.md and accuracy.png from results.json")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads((Path(args.out) / "results.json").read_text())
        (Path(args.out) / "results.md").write_text(markdown(saved["summary"], saved["meta"]))
        plot(saved["summary"], saved["runs"], Path(args.out) / "accuracy.png", saved["meta"])
        return
    if args.quick:
        args.seeds, args.points, args.train, args.val, args.test, args.epochs = args.seeds[:2], 32, 120, 40, 60, 2
        if args.out == str(DEFAULT_OUT):
            args.out = str(DEFAULT_OUT.parent / "platonic_pointcloud_quick")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()
    rows: list[dict[str, Any]] = []
    orders = {}
    for seed in args.seeds:  # seeds outermost: a partial run still compares every group
        for group in args.groups:
            row = run_one(group, seed, args)
            orders[group] = row["group_order"]
            rows.append(row)
            print(
                f"seed {seed} {group:>7s} (|G|={row['group_order']:2d}, {row['params']:,} params): "
                f"val {row['val_accuracy']:.3f} (epoch {row['best_epoch']}), test so3 {row['test_so3']:.3f}, "
                f"upright {row['test_none']:.3f}, {row['total_s']:.0f} s, load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    summary = summarise(rows, args.groups)
    meta = {
        "width": args.width,
        "depth": args.depth,
        "mlp_ratio": args.mlp_ratio,
        "points": args.points,
        "train": args.train,
        "val": args.val,
        "test": args.test,
        "epochs": args.epochs,
        "batch": args.batch,
        "lr": args.lr,
        "seeds": args.seeds,
        "threads": args.threads,
        "quick": args.quick,
        "num_classes": 10,
        "orders": orders,
        "train_rotate": args.train_rotate,
        "val_rotate": args.train_rotate,
        "test_rotate": ["so3", "none"],
        "wall_s": time.perf_counter() - wall,
        "loadavg_end": [round(v, 2) for v in os.getloadavg()],
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=2))
    (out / "results.md").write_text(markdown(summary, meta))
    plot(summary, rows, out / "accuracy.png", meta)
    print(markdown(summary, meta))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
