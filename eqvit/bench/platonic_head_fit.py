"""Can the Platonic image classifiers fit? Training loss on a few digits, per frame-pooling head.

A capacity check behind ``head_pool``: the ablation's Platonic image models (width 48, depth 6,
8x8 patches of 32x32 rotated MNIST) and timm's ViT at the same width, each trained full batch on
the first ``--digits`` training digits with AdamW for ``--steps`` steps. A model that cannot drive
this loss towards zero has an optimisation problem, not a data problem. Writes JSON and prints a
markdown table.

    python benchmarks/platonic_head_fit.py
    python benchmarks/platonic_head_fit.py --digits 64 --steps 300 --out benchmarks/results/platonic_head_fit.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eqvit.bench._paths import results_dir
from eqvit.bench.ablate import IMAGE_WIDTH as WIDTH
from eqvit.bench.ablate import platonic_image_model, timm_image_vit
from eqvit.bench.so3vit_vs_s2transformer import count_params

DEPTH = 6


def build(label: str) -> torch.nn.Module:
    """``"timm"`` or ``"<frames> <pool>"`` (e.g. ``"C4 max"``): an ablation-sized image classifier."""
    if label == "timm":
        return timm_image_vit(in_chans=1, num_classes=10, depth=DEPTH)
    frames, pool = label.split()
    return platonic_image_model(frames, in_chans=1, num_classes=10, depth=DEPTH, head_pool=pool)


def fit(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> dict:
    """Full-batch AdamW (torch's default weight decay 0.01), run by the engine's Trainer: the loss at the
    first, middle and last step, and the time per step."""
    from eqvit.train.classify import classifier_config
    from eqvit.train.engine import Trainer
    from eqvit.train.tasks import TensorClassificationTask

    config = classifier_config(epochs=steps, batch_size=len(x), lr=lr, weight_decay=0.01, eval_every=None)
    task = TensorClassificationTask((x, y), (x, y), batch_size=len(x), model=model, shuffle=False)
    trainer = Trainer(config, progress=False, model=model, task=task, write=False)
    trainer.fit()
    losses = [row["loss"] for row in trainer.history.train]
    return {
        "loss_first": losses[0],
        "loss_mid": losses[steps // 2],
        "loss_last": losses[-1],
        "loss_min": min(losses),
        "s_per_step": trainer.train_seconds / steps,
        "params": count_params(model),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digits", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--models", nargs="+", default=["timm", "C1 mean", "C4 mean", "C4 max", "D4 mean", "D4 max"],
        help='"timm" or "<frames> <mean|max>"',
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=results_dir() / "platonic_head_fit.json")
    args = parser.parse_args()
    if args.digits < 1 or args.steps < 2:
        raise ValueError(f"expected --digits >= 1 and --steps >= 2, got {args.digits} and {args.steps}")
    torch.set_num_threads(args.threads)

    from eqvit.data.images import rotated_mnist

    x, y = rotated_mnist(0.1, seed=args.seed, img_size=32)["train"]
    x, y = x[: args.digits], y[: args.digits]
    rows = []
    for label in args.models:
        torch.manual_seed(args.seed)
        row = {"model": label} | fit(build(label), x, y, args.steps, args.lr)
        rows.append(row)
        ms = row["s_per_step"] * 1e3
        print(f"{label}: loss {row['loss_first']:.3f} -> {row['loss_last']:.4f} ({ms:.0f} ms/step)")

    lines = [
        f"Full-batch fit of {args.digits} rotated MNIST digits, AdamW lr {args.lr:g}, {args.steps} steps, "
        f"width {WIDTH}, depth {DEPTH}, seed {args.seed}, {args.threads} thread(s).",
        "",
        "| model | params | loss step 1 | loss mid | loss last | ms/step |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['params']:,} | {r['loss_first']:.3f} | {r['loss_mid']:.3f} | {r['loss_last']:.4f} "
            f"| {r['s_per_step'] * 1e3:.0f} |"
        )
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
