"""Equal wall-clock accuracy on shallow water: SO3ViT vs the APE ablation vs S2Transformer.

Each model trains for the same budget of training-step time (default 20 min on CPU;
``--minutes`` to shorten) on the same data stream with the same optimiser settings
(``configs/swe_accuracy.yaml``). The models train interleaved, in rounds of ``--slice`` seconds
each, so load from other jobs on a shared machine hits all of them alike. Then each is scored on
the same validation simulations: quadrature-weighted relative L2 and L1 and
the polar error ratio (mean error poleward of 60 deg latitude over the global mean; 1 = uniform,
the SO(3)-RoPE paper's Figure 3 claim in one number). Then every model is rolled out
autoregressively for ``--rollout`` steps (default 16) from the same initial conditions
(:mod:`eqvit.train.rollout`): ``rollout.png`` holds the error against lead time of every model and
persistence, and the error maps at a few lead times. Writes JSON, error-map PNGs, prints tables.

Usage: ``python benchmarks/swe_accuracy.py [--minutes 20] [--models ...] [--out DIR]``
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
from pathlib import Path

import torch

from eqvit.bench._paths import config_path, results_dir
from eqvit.train.config import load_config
from eqvit.train.engine import Trainer

MODELS = {
    # The Coriolis force keeps only rotations about z: SO3ViT breaks symmetry with latitude encoding.
    "so3vit_4x128": {"symmetry_breaking": "latitude", "residual": True},
    "vit_ape_4x128": {"residual": True},
    "s2transformer_4x128": {"residual": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="training wall-clock per model")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--config", default=str(config_path("swe_accuracy.yaml")))
    parser.add_argument("--out", default=str(results_dir() / "swe_accuracy"))
    parser.add_argument("--max-steps", type=int, default=None, help="also stop after N steps (smoke tests)")
    parser.add_argument("--slice", type=float, default=60.0, help="seconds per model per interleaved round")
    parser.add_argument("--rollout", type=int, default=16, help="autoregressive rollout steps (0: none)")
    args = parser.parse_args()

    base = load_config(args.config)
    out = Path(args.out)
    trainers = {}
    for name in args.models:
        cfg = copy.deepcopy(base)
        cfg.model.name, cfg.model.kwargs = name, dict(MODELS[name])
        trainers[name] = Trainer(cfg, out_dir=out / name, progress=False)
        trainers[name].start(max_steps=args.max_steps, max_minutes=args.minutes)
    round_ = 0
    while not all(t.done for t in trainers.values()):
        round_ += 1
        for trainer in trainers.values():
            if not trainer.done:
                trainer.train_for(args.slice)
        status = ", ".join(f"{n}: {t.step} steps / {t.train_seconds / 60:.1f} min" for n, t in trainers.items())
        print(f"round {round_}: {status}", flush=True)
    results = {name: trainer.finish() for name, trainer in trainers.items()}

    print(f"\nEqual wall-clock ({args.minutes:g} min each), {base.data.num_val} validation simulations")
    print(f"{'model':<22} {'params':>8} {'steps':>6} {'s/step':>7} {'rel L2':>8} {'rel L1':>8} {'polar ratio':>12}")
    persistence = next(iter(results.values()))["persistence"]
    for name, r in results.items():
        m = r["metrics"]
        print(
            f"{name:<22} {r['params'] / 1e6:>7.2f}M {r['steps']:>6} {r['seconds_per_step']:>7.2f} "
            f"{m['rel_l2']:>8.4f} {m['rel_l1']:>8.4f} {m['polar_error_ratio']:>12.3f}"
        )
    print(
        f"{'persistence':<22} {'':>8} {'':>6} {'':>7} {persistence['rel_l2']:>8.4f} {persistence['rel_l1']:>8.4f} "
        f"{persistence['polar_error_ratio']:>12.3f}"
    )
    if args.rollout > 0:
        from eqvit.train.rollout import plot_rollout_comparison, rollout, rollout_json, rollout_table

        rollouts = {name: rollout(t.model, t.task, args.rollout) for name, t in trainers.items()}
        for name, r in rollouts.items():
            results[name]["rollout"] = rollout_json(r)
            print(f"\nrollout of {name}:\n{rollout_table(r)}")
        out.mkdir(parents=True, exist_ok=True)
        plot_rollout_comparison(
            rollouts,
            out / "rollout.png",
            title=f"Autoregressive rollouts after {args.minutes:g} min of training each",
        )
    report = {
        "minutes_per_model": args.minutes,
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "swe_accuracy.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out / 'swe_accuracy.json'}, rollout.png and per-model error_map.png / loss_curve.png")


if __name__ == "__main__":
    main()
