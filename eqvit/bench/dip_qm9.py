"""DiP on QM9 at an equal CPU budget: trivial frames against tetrahedral (and octahedral) frames.

Every model is ``configs/dip_qm9.yaml``'s denoiser and diffusion with only the frames changed, at the same width
``|G| C`` and depth (the trivial model has 12 heads where T has one per frame: the same attention cost). Each
trains for ``--minutes`` of its own step time (:class:`~eqvit.train.engine.Trainer`, the ``qm9_generation``
task); the models train side by side in rounds of ``--round-seconds``, in rotating order, so load on the
machine falls on all of them alike. Then each samples ``--num`` molecules (the same atom counts and seed for
every model) and scores them with every metric of :func:`eqvit.chem.metrics.molecule_metrics`: atom and
molecule stability (EDM), RDKit validity, uniqueness, novelty against the training split, PoseBusters.

Writes ``--out`` (default ``benchmarks/results/dip_qm9.json``): a list of rows, one per model (``frames``, the
metrics, ``params``, ``steps``, ``epochs``, ``train_s``, ``sample_s``, ``wall_s``, load averages, the machine),
then EDM's published QM9 figures as context (a different budget: 3,000 epochs on a GPU). Each model's run
folder (``--runs``) keeps its checkpoint, ``samples.sdf`` / ``.xyz`` and ``molecules.png``; the T model's
depictions are copied beside the JSON (``dip_qm9_molecules.png``).

Usage::

    python benchmarks/dip_qm9.py                      # trivial and T, 60 minutes each, 1,000 samples each
    python benchmarks/dip_qm9.py --frames trivial T O --minutes 30
    python benchmarks/dip_qm9.py --quick              # CI size (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from eqvit.bench._interleave import train_interleaved
from eqvit.bench._paths import config_path, display_path, results_dir

# EDM (Hoogeboom et al. 2022, Table 2), QM9 with hydrogens: published, full budget, not comparable.
PUBLISHED_EDM = {
    "frames": "EDM (E(3), published)",
    "atom_stability": 0.987,
    "molecule_stability": 0.820,
    "validity": 0.919,
    "valid_and_unique": 0.907,
}
SHOWN = ("atom_stability", "molecule_stability", "validity", "uniqueness", "valid_and_unique", "novelty", "pb_all")


def _config(args: argparse.Namespace, frames: str):
    from eqvit.train.config import load_config

    config = load_config(args.config)
    config.model.name = "dip_qm9_trivial" if frames == "trivial" else f"dip_qm9_{frames}"
    config.model.kwargs = {**config.model.kwargs, "group": frames}
    config.train.max_steps, config.train.max_minutes = 10**9, args.minutes
    config.train.threads = args.threads
    config.train.eval_every = args.eval_every
    config.train.out = str(Path(args.runs) / frames)
    config.data.diffusion.eval_samples = 0
    if args.sample_ratio < 1:
        config.data.sample_ratio = args.sample_ratio
    if args.eval_subset is not None:
        config.data.eval_subset = args.eval_subset
    if args.steps is not None:
        config.data.diffusion.steps = args.steps
    return config


def train_side_by_side(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Train one model per ``args.frames`` for ``args.minutes`` of step time, interleaved; return the runs."""
    from eqvit.train.engine import Trainer

    runs = []
    for frames in args.frames:
        config = _config(args, frames)
        out = Path(config.train.out)
        for stale in ("last.safetensors", "last.json", "best.safetensors", "best.json"):
            (out / stale).unlink(missing_ok=True)  # a fresh run each time the benchmark runs
        trainer = Trainer(config, progress=False)
        trainer.start()
        runs.append({"frames": frames, "trainer": trainer, "load": [], "begin": time.time()})

    def report(rounds: int) -> None:
        print(
            f"round {rounds}: "
            + ", ".join(f"{r['frames']} {r['trainer'].step} steps {r['trainer'].train_seconds:.0f} s" for r in runs),
            flush=True,
        )

    train_interleaved(runs, args.round_seconds, report)
    for run in runs:
        run["summary"] = run["trainer"].finish()
    return runs


def sample_and_score(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    """``args.num`` molecules from the run's last model, scored; the row of the results."""
    from eqvit.train.sample import score_molecules

    trainer = run["trainer"]
    task, out = trainer.task, Path(trainer.out)
    load_before = os.getloadavg()[0]
    begin = time.perf_counter()
    molecules = task.sample(trainer.model, args.num, seed=args.seed)
    sample_s = time.perf_counter() - begin
    metrics = score_molecules(molecules, task, out, energy_limit=args.energy_limit)
    diffusion = trainer.config.data.diffusion
    epochs = trainer.step / task.steps_per_epoch
    row = {
        "frames": run["frames"],
        **metrics,
        "params": run["summary"]["params"],
        "steps": trainer.step,
        "epochs": epochs,
        "train_s": trainer.train_seconds,
        "sample_s": sample_s,
        "wall_s": time.time() - run["begin"],
        "val_loss": run["summary"]["val_loss"],
        "model": trainer.config.model.name,
        "kwargs": trainer.config.model.kwargs,
        "diffusion": {k: getattr(diffusion, k) for k in ("schedule", "target", "weighting", "sampler", "steps")},
        "batch_size": trainer.config.data.batch_size,
        "load_avg_1min_train": {"mean": statistics.fmean(run["load"]), "max": max(run["load"])},
        "load_avg_1min_sample": [load_before, os.getloadavg()[0]],
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "run": display_path(out),
    }
    print(
        f"{run['frames']:<8} {trainer.step} steps ({epochs:.2f} epochs) in {trainer.train_seconds:.0f} s, sampled "
        f"{args.num} in {sample_s:.0f} s: " + ", ".join(f"{k} {100 * metrics[k]:.1f}%" for k in SHOWN if k in metrics),
        flush=True,
    )
    return row


def table(rows: list[dict[str, Any]], minutes: float) -> str:
    names = ("atom stab", "mol stab", "valid", "unique", "V&U", "novel", "PB all")
    head = f"{'frames':<24} {'params':>8} {'steps':>6} {'epochs':>6} " + " ".join(f"{n:>9}" for n in names)
    lines = [head]
    for row in rows:
        cells = " ".join(f"{100 * row[k]:>8.1f}%" if k in row else f"{'':>9}" for k in SHOWN)
        sizes = (
            f"{row['params'] / 1e6:>7.2f}M {row['steps']:>6} {row['epochs']:>6.2f}"
            if "params" in row
            else f"{'':>8} {'':>6} {'':>6}"
        )
        lines.append(f"{row['frames']:<24} {sizes} {cells}")
    lines.append(
        f"EDM: published, full budget (3,000 epochs on a GPU) -- NOT comparable to the {minutes:g} CPU minutes "
        "per model above."
    )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frames", nargs="+", default=["trivial", "T"], choices=["trivial", "T", "O", "I"])
    p.add_argument("--minutes", type=float, default=60.0, help="training minutes (step time) per model")
    p.add_argument("--num", type=int, default=1000, help="molecules sampled and scored per model")
    p.add_argument("--steps", type=int, default=None, help="sampling steps (default: the config's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled atom counts and noise")
    p.add_argument("--energy-limit", type=int, default=100, help="valid molecules given PoseBusters' energy check")
    p.add_argument("--round-seconds", type=float, default=60.0, help="step time per model per interleaved round")
    p.add_argument("--eval-every", type=int, default=2000, help="validation loss every N steps")
    p.add_argument("--eval-subset", type=int, default=None, help="validation molecules (default: the config's)")
    p.add_argument("--sample-ratio", type=float, default=1.0, help="fraction of the 100,000 training molecules")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--config", type=Path, default=config_path("dip_qm9.yaml"))
    p.add_argument("--runs", type=Path, default=Path("runs") / "dip_qm9_bench", help="run folders")
    p.add_argument("--out", type=Path, default=results_dir() / "dip_qm9.json")
    p.add_argument("--quick", action="store_true", help="CI size: seconds per model, a few molecules")
    args = p.parse_args(argv)
    if args.quick:
        args.minutes, args.round_seconds, args.eval_every = 0.05, 1.0, 5
        args.num, args.steps, args.energy_limit, args.eval_subset = 4, 3, 1, 16
    return args


def main(argv: list[str] | None = None) -> int:
    from eqvit.chem.rdkit_mols import require_gen

    args = parse(argv)
    require_gen("the DiP benchmark")
    torch.set_num_threads(args.threads)
    runs = train_side_by_side(args)
    rows = [sample_and_score(args, run) for run in runs]
    rows.append(dict(PUBLISHED_EDM))
    text = table(rows, args.minutes)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    depictions = Path(runs[-1]["trainer"].out) / "molecules.png"
    tetra = [run for run in runs if run["frames"] == "T"]
    if tetra:
        depictions = Path(tetra[0]["trainer"].out) / "molecules.png"
    if depictions.is_file():
        shutil.copyfile(depictions, out.with_name(out.stem + "_molecules.png"))
    print(f"wrote {display_path(out)}")
    return 0


if __name__ == "__main__":
    main()
