"""QM9 property regression at an equal CPU budget: trivial, T, O, I frames and a plain transformer.

Every model has the same width ``|G| * C`` (default 240: 240, 20, 10 and 4 channels per frame)
and depth, fixed-key attention with frame RoPE for the Platonic models (the seed's QM9 choice,
App. M), and the plain transformer is the same network with trivial frames, no RoPE and learned
keys (positions enter only through the linear embedding of the centred coordinates). Each model
trains for ``--minutes`` of its own step time (:class:`~eqvit.train.engine.Trainer`, the
``data.name: qm9`` task, the Cormorant / EGNN split). The models train side by side in rounds of
``--round-seconds``, in rotating order, so load on the machine falls on all of them alike.
Then each is scored on the whole test split (``--eval-subset`` shortens the validation curve only).

Also measured (``--layout-rounds``): the time of a training step on batches bucketed by atom count
(what the task does: no padding, no mask) against the same molecules padded to the largest
count in the batch, and against the batch packed into one sequence of all its atoms. Both of those
would need a dense attention mask for exact results (padding masks the pad atoms, packing is block
diagonal); they are timed without one, so each figure is a lower bound on that layout's cost.

Writes ``--out`` (default ``benchmarks/results/qm9.json``) and the learning curves beside it
(``qm9_curves.png``), and prints the table with EGNN's published full-budget figures for context.

Usage::

    python benchmarks/qm9.py                         # 5 models x 20 minutes, gap, seed 0
    python benchmarks/qm9.py --minutes 4 --seeds 0 --targets gap
    python benchmarks/qm9.py --quick                 # CI size (seconds)
    python benchmarks/qm9.py --root DIR              # the original .xyz files instead of qm9pack
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

import numpy as np
import torch

from eqvit.bench._interleave import train_interleaved
from eqvit.bench._paths import display_path, results_dir

MODELS = {
    "plain": dict(group="trivial", posenc="none", attention="softmax"),
    "trivial": dict(group="trivial"),
    "T": dict(group="T"),
    "O": dict(group="O"),
    "I": dict(group="I"),
}


def _config(args: argparse.Namespace, name: str, seed: int):
    from eqvit.train.config import DataConfig, ExperimentConfig, ModelConfig, OptimConfig, ScheduleConfig, TrainConfig

    kwargs = dict(MODELS[name], embed_dim=args.width, depth=args.depth, mlp_ratio=args.mlp_ratio)
    kwargs["num_targets"] = len(args.targets)
    return ExperimentConfig(
        model=ModelConfig(name="platonic_qm9_s", kwargs=kwargs),
        data=DataConfig(
            name="qm9",
            targets=list(args.targets),
            batch_size=args.batch,
            val_batch_size=256,
            seed=seed,
            split_seed=0,
            sample_ratio=args.sample_ratio,
            eval_subset=args.eval_subset,
            root=args.root,
            cache_dir=args.cache_dir,
        ),
        optim=OptimConfig(name="adamw", lr=args.lr, weight_decay=1e-5),
        schedule=ScheduleConfig(name="cosine", warmup_steps=args.warmup, min_lr=1e-6),
        train=TrainConfig(
            max_steps=10**9, max_minutes=args.minutes, eval_every=args.eval_every, seed=seed, threads=args.threads
        ),
    )


def _curve(trainer) -> list[dict[str, float]]:
    """Validation rows with the training seconds spent by their step."""
    seconds = {row["step"]: row["time_s"] for row in trainer.history.train}
    return [{**row, "time_s": seconds.get(row["step"], 0.0)} for row in trainer.history.evals]


def train_side_by_side(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Train every (model, seed) for ``args.minutes`` of step time, interleaved; return their records."""
    from eqvit.train.engine import Trainer

    runs = []
    for seed in args.seeds:
        for name in args.models:
            torch.manual_seed(seed)
            trainer = Trainer(_config(args, name, seed), progress=False, write=False)
            trainer.start()
            runs.append({"model": name, "seed": seed, "trainer": trainer, "load": []})
    train_interleaved(runs, args.round_seconds)
    records = []
    for run in runs:
        trainer = run["trainer"]
        summary = trainer.finish()
        epochs = trainer.step / trainer.task.steps_per_epoch
        records.append(
            {
                "model": run["model"],
                "seed": run["seed"],
                "kwargs": trainer.config.model.kwargs,
                "params": summary["params"],
                "steps": trainer.step,
                "epochs": epochs,
                "train_seconds": trainer.train_seconds,
                "seconds_per_epoch": trainer.train_seconds / epochs if epochs else None,
                "val_mae": summary["val_mae"],
                "test_mae": summary["test_mae"],
                "test_molecules": summary["test_molecules"],
                "val_molecules": summary["val_molecules"],
                "curve": _curve(trainer),
                "load_avg_1min": {"mean": statistics.fmean(run["load"]), "max": max(run["load"])},
            }
        )
        print(
            f"{run['model']:<8} seed {run['seed']}: {trainer.step} steps ({epochs:.3f} epochs) in "
            f"{trainer.train_seconds:.0f} s, test MAE "
            + ", ".join(f"{k} {v:.4g}" for k, v in summary["test_mae"].items()),
            flush=True,
        )
    return records


def _step_seconds(model, batches, rounds: int) -> float:
    """Median seconds of one forward + backward over ``batches`` (a list of ``(pos, atoms)``)."""
    times = []
    for _ in range(rounds):
        for pos, atoms in batches:
            begin = time.perf_counter()
            model(pos, atoms).sum().backward()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def bucket_vs_pad(args: argparse.Namespace) -> dict[str, Any]:
    """Step time on the same molecules: atom-count buckets against padding to the batch's largest count and
    against packing the batch into one sequence (both timed without the attention mask that exact results
    would need, so both are lower bounds on their cost)."""
    import eqvit
    from eqvit.data.qm9 import element_index, qm9_splits

    train = qm9_splits(0, root=args.root, cache_dir=args.cache_dir)["train"]
    rng = np.random.default_rng(0)
    counts = train.num_atoms
    model = eqvit.create_model(
        "platonic_qm9_s", **dict(MODELS["T"], embed_dim=args.width, depth=args.depth, mlp_ratio=args.mlp_ratio)
    )
    batch = args.batch
    bucketed, padded, packed, molecules = [], [], [], 0
    for _ in range(args.layout_batches):
        n = rng.choice(counts)  # a bucket: molecules of one count
        rows = rng.choice(np.flatnonzero(counts == n), size=min(batch, int((counts == n).sum())), replace=False)
        pos, atoms = train.same_size_batch(rows)
        onehot = np.eye(5, dtype=np.float32)[element_index(atoms)]
        bucketed.append((torch.from_numpy(pos.astype(np.float32)), torch.from_numpy(onehot)))
        mixed = rng.choice(len(train), size=len(rows), replace=False)  # the same number of random molecules
        width = counts[mixed].max()
        pos_p = np.zeros((len(rows), width, 3), dtype=np.float32)
        feat_p = np.zeros((len(rows), width, 5), dtype=np.float32)
        for r, m in enumerate(mixed):
            p, a, _ = train[m]
            pos_p[r, : len(a)], feat_p[r, : len(a)] = p, np.eye(5)[element_index(a)]
        padded.append((torch.from_numpy(pos_p), torch.from_numpy(feat_p)))
        real = [(pos_p[r, : counts[m]], feat_p[r, : counts[m]]) for r, m in enumerate(mixed)]
        packed.append(tuple(torch.from_numpy(np.concatenate(part)[None]) for part in zip(*real)))  # [1, sum N, .]
        molecules += len(rows)
    layouts = {"bucketed": bucketed, "padded": padded, "packed": packed}
    results: dict[str, list[float]] = {kind: [] for kind in layouts}
    kinds = list(layouts)
    for r in range(args.layout_rounds):  # interleaved, rotating order
        for kind in kinds[r % 3 :] + kinds[: r % 3]:
            results[kind].append(_step_seconds(model, layouts[kind], 1))
    b, p, k = (statistics.median(results[kind]) for kind in kinds)
    return {
        "batches": args.layout_batches,
        "batch_size": batch,
        "rounds": args.layout_rounds,
        "bucketed_step_s": b,
        "padded_step_s": p,
        "padded_over_bucketed": p / b,
        "packed_step_s": k,
        "packed_over_bucketed": k / b,
        "load_avg_1min": os.getloadavg()[0],
        "note": "padded and packed timings run without the attention mask exact results would need (lower bounds)",
    }


def published() -> dict[str, float]:
    from eqvit.train.regression import PUBLISHED_EGNN

    return dict(PUBLISHED_EGNN)


def table(records: list[dict[str, Any]], targets: list[str], minutes: float) -> str:
    from eqvit.train.regression import UNITS

    egnn = published()
    head = "".join(f" {f'test {t} [{UNITS[t][0]}]':>20}" for t in targets)
    lines = [f"{'model':<8} {'seeds':>5} {'steps':>7} {'epochs':>7} {'s/epoch':>8} {'load':>5}{head}"]
    for name in dict.fromkeys(r["model"] for r in records):
        rows = [r for r in records if r["model"] == name]
        cells = []
        for t in targets:
            values = [r["test_mae"][t] for r in rows]
            spread = f" ±{statistics.stdev(values):.3g}" if len(values) > 1 else ""
            cells.append(f" {f'{statistics.fmean(values):.4g}{spread}':>20}")
        lines.append(
            f"{name:<8} {len(rows):>5} {statistics.fmean(r['steps'] for r in rows):>7.0f} "
            f"{statistics.fmean(r['epochs'] for r in rows):>7.3f} "
            f"{statistics.fmean(r['seconds_per_epoch'] for r in rows):>8.0f} "
            f"{statistics.fmean(r['load_avg_1min']['mean'] for r in rows):>5.2f}" + "".join(cells)
        )
    ref = "".join(f" {egnn[t] if t in egnn else float('nan'):>20.4g}" for t in targets)
    lines.append(f"{'EGNN*':<8} {'':>5} {'':>7} {'1000':>7} {'':>8} {'':>5}{ref}")
    lines.append(
        f"* EGNN (Satorras et al. 2021): published, full budget (1,000 epochs on a GPU) -- NOT comparable to the "
        f"{minutes:g} CPU minutes per model above."
    )
    return "\n".join(lines)


def plot(records: list[dict[str, Any]], targets: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eqvit.train.regression import UNITS

    fig, axes = plt.subplots(1, len(targets), figsize=(5.5 * len(targets), 4), squeeze=False)
    for ax, t in zip(axes[0], targets):
        for r in records:
            curve = [row for row in r["curve"] if f"mae_{t}" in row]
            ax.plot(
                [row["time_s"] / 60 for row in curve],
                [row[f"mae_{t}"] for row in curve],
                "o-",
                ms=3,
                label=f"{r['model']} (seed {r['seed']})",
            )
        ax.set_xlabel("training minutes (CPU, 1 thread)")
        ax.set_ylabel(f"validation MAE {t} [{UNITS[t][0]}]")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle("QM9 at equal width |G|·C and equal CPU time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0, help="training minutes (step time) per model")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--targets", nargs="+", default=["gap"], help="QM9 targets (gap, u0, homo, ...)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--width", type=int, default=240, help="|G| * C, the same for every model")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--mlp-ratio", type=float, default=2.0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=200, help="validation every N steps")
    p.add_argument("--eval-subset", type=int, default=None, help="validate on the first N val molecules (test: all)")
    p.add_argument("--sample-ratio", type=float, default=1.0, help="fraction of the 100,000 training molecules")
    p.add_argument("--round-seconds", type=float, default=30.0, help="step time per model per interleaved round")
    p.add_argument("--layout-batches", type=int, default=8)
    p.add_argument("--layout-rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--root", default=None, help="folder of the original QM9 .xyz files (default: qm9pack)")
    p.add_argument("--cache-dir", default=None, help="where the parsed arrays are cached")
    p.add_argument("--out", type=Path, default=results_dir() / "qm9.json")
    p.add_argument("--quick", action="store_true", help="CI size: seconds per model, small subsets")
    args = p.parse_args(argv)
    if args.quick:
        args.minutes, args.eval_every, args.round_seconds = 0.05, 5, 1.0
        args.eval_subset = args.eval_subset or 64
        args.layout_batches, args.layout_rounds, args.batch = 2, 2, 8
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    started = time.time()
    layout = bucket_vs_pad(args)
    print(
        f"bucketed {layout['bucketed_step_s'] * 1e3:.1f} ms/step, padded {layout['padded_step_s'] * 1e3:.1f} ms/step "
        f"(x{layout['padded_over_bucketed']:.2f}), packed {layout['packed_step_s'] * 1e3:.1f} ms/step "
        f"(x{layout['packed_over_bucketed']:.2f}; load {layout['load_avg_1min']:.2f})",
        flush=True,
    )
    records = train_side_by_side(args)
    text = table(records, args.targets, args.minutes)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    curves = out.with_name(out.stem + "_curves.png")
    plot(records, args.targets, curves)
    result = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "split": "Cormorant / EGNN, split_seed 0 (100,000 / 17,748 / 13,083 for the full set)",
        "layout": layout,
        "records": records,
        "published_egnn_full_budget_not_comparable": published(),
        "table": text,
        "wall_seconds": time.time() - started,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "curves": display_path(curves),
    }
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {display_path(out)} and {display_path(curves)}")
    return 0


if __name__ == "__main__":
    main()
