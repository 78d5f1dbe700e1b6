"""MLP G-sets of a D4 ViT (the O(2) seed's Sec. 5.3 / Figure 6) on rotated MNIST, the shipped stand-in.

The feature space is ``V = 3q`` copies of D4's regular representation; the MLP's nonlinearity acts on
functions on a G-set X (Sec. 4.3), for three families of n orbits each, all irreps present:

* ``D4``: n regular orbits (a fraction 1/8 of the hidden features in the trivial irrep A1);
* ``D4 + 8 pts``: n regular orbits and 8n fixed points (9/16 A1);
* ``D4/C4 + D4/D1 + D4/D2'``: n copies of each (``mlp_spaces=[("C4", n), ("D1", n), ("D2[45deg]", n)]``;
  the seed's ``D4/<r>``, ``D4/<t>``, ``D4/<tr, r^2>``; 3/8 A1),

with ``n = mlp_ratio * 3q`` for the seed's MLP ratios 1/3, 1, 2. Every model is trained (AdamW, App. F)
on ``--ratio`` of the 4,000 training digits with early stopping on validation accuracy, and the best
validation accuracy is plotted against the A1 fraction of the hidden layer, one panel per MLP ratio
(the seed's Fig. 6 puts log10(params) on the x axis; both are in the table).

Writes ``results.json`` (every run, with ``os.getloadavg()`` at its end), ``results.md`` (the table) and
``accuracy_vs_a1_fraction.png`` under ``benchmarks/results/o2_gsets[_quick]/``. ``--quick``: one
q, one MLP ratio, two epochs, depth 1 (seconds).

Usage: ``python benchmarks/o2_gsets.py [--qs 1 2] [--mlp-ratios 0.333 1 2] [--seeds 0 1] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from eqvit.bench._paths import results_dir
from eqvit.bench._pool import process_pool

GSETS = {
    "D4": lambda n: [("regular", n)],
    "D4 + 8 pts": lambda n: [("regular", n), ("trivial", 8 * n)],
    "D4/C4 + D4/D1 + D4/D2'": lambda n: [("C4", n), ("D1", n), ("D2[45deg]", n)],
}
IMG_SIZE, PATCH = 32, 8


def build(q: int, gset: str, mlp_ratio: float, depth: int) -> tuple[torch.nn.Module, list]:
    """The D4 model with ``3q`` regular copies and the G-set family ``gset`` at ``mlp_ratio``."""
    import eqvit

    n = max(1, round(mlp_ratio * 3 * q))
    spaces = GSETS[gset](n)
    model = eqvit.create_model(
        "o2vit_square_s", group="D4", img_size=IMG_SIZE, patch_size=PATCH, in_chans=1, num_classes=10,
        regular_copies=3 * q, num_heads=3, depth=depth, mlp_spaces=spaces,
    )  # fmt: skip
    return model, spaces


def train_run(spec: dict) -> dict:
    """Train one (q, G-set, MLP ratio, seed) model; returns its row."""
    from eqvit.data.images import rotated_mnist
    from eqvit.groups import get_group
    from eqvit.models.o2vit import trivial_fraction
    from eqvit.train.classify import fit_classifier

    torch.set_num_threads(1)
    data = rotated_mnist(spec["ratio"], seed=spec["seed"], img_size=IMG_SIZE)
    torch.manual_seed(spec["seed"])
    model, spaces = build(spec["q"], spec["gset"], spec["mlp_ratio"], spec["depth"])
    hidden = model.blocks[0].mlp.act.in_type
    start = time.perf_counter()
    _, history = fit_classifier(
        model, data["train"], data["val"], epochs=spec["epochs"], batch_size=16, lr=1e-3, patience=spec["patience"],
        seed=spec["seed"],
    )  # fmt: skip
    return dict(
        spec,
        spaces=[list(p) for p in spaces],
        hidden_dim=hidden.dim,
        a1_fraction=trivial_fraction(get_group("D4"), spaces),
        a1_features=int(hidden.multiplicities[0]),
        params=sum(p.numel() for p in model.parameters()),
        accuracy=history.best_accuracy,
        best_epoch=history.best_epoch + 1,
        epochs_run=history.epochs,
        seconds=time.perf_counter() - start,
        loadavg=os.getloadavg(),
    )


def summarise(rows: list[dict]) -> list[dict]:
    keys = sorted(
        {(r["mlp_ratio"], r["q"], r["gset"]) for r in rows}, key=lambda k: (k[0], k[1], list(GSETS).index(k[2]))
    )
    out = []
    for mlp_ratio, q, gset in keys:
        sel = [r for r in rows if (r["mlp_ratio"], r["q"], r["gset"]) == (mlp_ratio, q, gset)]
        acc = [100 * r["accuracy"] for r in sel]
        out.append(
            dict(
                mlp_ratio=mlp_ratio, q=q, gset=gset, a1_fraction=sel[0]["a1_fraction"], hidden_dim=sel[0]["hidden_dim"],
                params=sel[0]["params"], seeds=[r["seed"] for r in sel], accuracy_mean=statistics.fmean(acc),
                accuracy_std=statistics.stdev(acc) if len(acc) > 1 else 0.0,
                epochs_mean=statistics.fmean(r["epochs_run"] for r in sel),
            )
        )  # fmt: skip
    return out


def table(summary: list[dict], settings: dict) -> str:
    lines = [
        f"D4 MLP G-sets on rotated MNIST (stand-in), ratio {settings['ratio']}, depth {settings['depth']}, "
        f"max epochs {settings['epochs']} / patience {settings['patience']}: best validation accuracy, mean ± std "
        "over seeds.",
        "",
        "| MLP ratio | q | G-set | A1 fraction | hidden dim | params | accuracy (%) | seeds | epochs |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary:
        lines.append(
            f"| {r['mlp_ratio']:g} | {r['q']} | {r['gset']} | {r['a1_fraction']:.4f} | {r['hidden_dim']} | "
            f"{r['params']:,} | {r['accuracy_mean']:.2f} ± {r['accuracy_std']:.2f} | {len(r['seeds'])} | "
            f"{r['epochs_mean']:.0f} |"
        )
    return "\n".join(lines)


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = sorted({r["mlp_ratio"] for r in summary})
    fig, axes = plt.subplots(1, len(ratios), figsize=(5 * len(ratios), 4), squeeze=False)
    for ax, ratio in zip(axes[0], ratios):
        for q in sorted({r["q"] for r in summary}):
            sel = sorted(
                (r for r in summary if r["mlp_ratio"] == ratio and r["q"] == q), key=lambda r: r["a1_fraction"]
            )
            ax.errorbar(
                [r["a1_fraction"] for r in sel], [r["accuracy_mean"] for r in sel],
                yerr=[r["accuracy_std"] for r in sel], fmt="o-", capsize=3, label=f"q = {q}",
            )  # fmt: skip
            for r in sel:
                ax.annotate(r["gset"], (r["a1_fraction"], r["accuracy_mean"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")  # fmt: skip
        ax.set_title(f"MLP ratio {ratio:g}")
        ax.set_xlabel("fraction of A1 features in the MLP hidden layer")
        ax.set_ylabel("best validation accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qs", type=int, nargs="+", default=[1, 2], help="V = 3q regular copies")
    parser.add_argument("--mlp-ratios", type=float, nargs="+", default=[1 / 3, 1.0, 2.0])
    parser.add_argument("--gsets", nargs="+", default=list(GSETS), choices=list(GSETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--ratio", type=float, default=0.1, help="fraction of the 4,000 training digits")
    parser.add_argument("--epochs", type=int, default=30, help="max epochs (the seed: 200)")
    parser.add_argument("--patience", type=int, default=10, help="early-stopping patience in epochs (the seed: 30)")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes, one thread each")
    parser.add_argument("--quick", action="store_true", help="one q, MLP ratio 1, 2 epochs, depth 1, one seed")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.qs, args.mlp_ratios, args.seeds, args.epochs, args.patience, args.depth = [1], [1.0], [0], 2, 1, 1
        args.ratio = 0.05
    bad = [q for q in args.qs if q < 1] + [r for r in args.mlp_ratios if r <= 0]
    if bad or not 0 < args.ratio <= 1:
        parser.error(f"expected --qs >= 1, --mlp-ratios > 0 and 0 < --ratio <= 1, got {bad or args.ratio}")
    out = args.out or results_dir() / ("o2_gsets_quick" if args.quick else "o2_gsets")
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "jobs")}
    settings.update(platform=platform.platform(), torch=torch.__version__, loadavg_start=os.getloadavg())
    specs = [
        dict(q=q, gset=g, mlp_ratio=r, seed=s, ratio=args.ratio, epochs=args.epochs, patience=args.patience,
             depth=args.depth)
        for r in args.mlp_ratios for q in args.qs for s in args.seeds for g in args.gsets
    ]  # fmt: skip
    wall = time.perf_counter()
    rows = []
    with process_pool(args.jobs) as pool:
        for row in pool.map(train_run, specs):
            rows.append(row)
            print(
                f"q={row['q']} mlp_ratio={row['mlp_ratio']:.3g} {row['gset']:<24} A1 {row['a1_fraction']:.3f}: "
                f"accuracy {row['accuracy']:.3f} ({row['params']:,} params, {row['seconds']:.0f} s, "
                f"load {row['loadavg'][0]:.1f})",
                flush=True,
            )
    settings.update(wall_minutes=(time.perf_counter() - wall) / 60, loadavg_end=os.getloadavg())
    summary = summarise(rows)
    text = table(summary, settings)
    (out / "results.json").write_text(json.dumps({"settings": settings, "summary": summary, "runs": rows}, indent=2))
    (out / "results.md").write_text(text + "\n")
    plot(summary, out / "accuracy_vs_a1_fraction.png")
    print(text)
    print(f"\nwrote {out / 'results.json'}, results.md and accuracy_vs_a1_fraction.png (load {os.getloadavg()})")
    if not all(math.isfinite(r["accuracy"]) for r in rows):
        raise SystemExit("some runs have no validation accuracy")


if __name__ == "__main__":
    main()
