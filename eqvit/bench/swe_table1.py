"""The SO(3)-RoPE seed's Table 1 on shallow water, at the seed's own budget.

Each row trains ``configs/<row config>`` (the seed's protocol, Sec. 4.1: 100 epochs of 256 fresh
on-the-fly samples, batch 16 = 1,600 steps, Adam; cosine schedule) and scores the final model on 50
validation simulations with the seed's metrics, ``l1`` / ``l2`` (the spherical mean absolute and
root-mean-square error of the normalised fields: torch-harmonics' ``L1LossS2`` / ``L2LossS2``, which
the seed's Table 1 reports), beside eqvit's relative errors ``rel_l1`` / ``rel_l2``
(:mod:`eqvit.train.metrics` relates them). Writes ``benchmarks/results/swe_table1.json`` (a list of
rows; running some rows replaces those rows and keeps the others), copies each run's
``loss_curve.png``, ``error_map.png``, ``metrics.json`` and ``evals.json`` to
``benchmarks/results/swe_table1/<row>/`` and prints the table.

Usage: ``python benchmarks/swe_table1.py [--rows so3vit_4x128 so3vit_4x256] [--max-minutes M]``
(``--max-minutes`` caps a row's training time; the cosine schedule then ends at that time, and the
row records the epochs reached). The SO3ViT rows run on one thread (``train.threads: 1`` in their
configs); the S2Transformer row is for a GPU (``train.device: cuda``).

``--variant NAME --set SECTION.KEY=VALUE ...`` trains a row with changed settings as a row of its own
(``<model>-NAME``, beside the config's row; its run folder is ``train.out-NAME``).

Probes of the gap to the seed: ``--probe NAME --steps N --set optim.lr=3e-3 model.num_heads=1`` trains
the first of ``--rows`` for N steps (its cosine schedule over those N) with the settings changed
(``model.KEY`` sets a model keyword, ``SECTION.KEY`` a config field; values are YAML), scores it the
same way and writes the row ``NAME`` into ``benchmarks/results/swe_table1/probes.json``.
``--example-data`` scores persistence with torch-harmonics' own data pipeline on its example's two grids
(64 x 128 equiangular, 128 x 256 Legendre-Gauss) and records its normalisation beside eqvit's
(``benchmarks/results/swe_table1/example_data.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eqvit.bench._paths import config_path, display_path, results_dir

# Table 1 (Appendix B) of the SO(3)-RoPE seed: the four rows this benchmark reproduces.
SEED: dict[str, dict[str, float]] = {
    "so3vit_4x128": {"params_m": 0.98, "l1": 0.045, "l2": 0.058},
    "so3vit_4x256": {"params_m": 3.54, "l1": 0.034, "l2": 0.043},
    "so3vit_4x512": {"params_m": 13.37, "l1": 0.028, "l2": 0.036},
    "s2transformer_4x128": {"params_m": 0.53, "l1": 0.031, "l2": 0.040},
}
CONFIGS = {
    "so3vit_4x128": "so3vit_swe_table1_4x128.yaml",
    "so3vit_4x256": "so3vit_swe_table1_4x256.yaml",
    "so3vit_4x512": "so3vit_swe_table1_4x512.yaml",
    "s2transformer_4x128": "s2transformer_swe_table1_4x128.yaml",
}
ARTIFACTS = ("loss_curve.png", "error_map.png", "metrics.json", "evals.json")


def machine() -> dict[str, Any]:
    """What ran the rows: platform, CPU count, torch version and threads."""
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }


def table_row(name: str, config_file: Path, summary: dict[str, Any], timing: dict[str, Any]) -> dict[str, Any]:
    """One JSON row from a run's summary (``metrics.json``) and its wall-clock / load record."""
    metrics, persistence = summary["metrics"], summary["persistence"]
    steps, epoch_steps = summary["steps"], 256 // 16
    return {
        "model": name,
        "config": display_path(config_file),
        "epochs": steps / epoch_steps,
        "steps": steps,
        "params": summary["params"],
        "l1": metrics["l1"],
        "l2": metrics["l2"],
        "rel_l1": metrics["rel_l1"],
        "rel_l2": metrics["rel_l2"],
        "polar_error_ratio": metrics["polar_error_ratio"],
        "persistence_l1": persistence["l1"],
        "persistence_l2": persistence["l2"],
        "persistence_rel_l2": persistence["rel_l2"],
        "seed_l1": SEED[name]["l1"],
        "seed_l2": SEED[name]["l2"],
        "seed_params_m": SEED[name]["params_m"],
        "train_seconds": summary["train_seconds"],
        "seconds_per_epoch": summary["seconds_per_step"] * epoch_steps,
        **timing,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """The seed's l1 / l2 beside ours (and our relative errors)."""
    head = f"{'model':<22} {'epochs':>6} {'seed l1':>8} {'seed l2':>8} {'l1':>7} {'l2':>7} {'rel L1':>7} {'rel L2':>7}"
    lines = [head + f" {'wall [min]':>10} {'load':>9}"]
    for r in rows:
        load = f"{r['loadavg_start'][0]:.1f}-{r['loadavg_end'][0]:.1f}" if r.get("loadavg_start") else "-"
        wall = f"{r['wall_s'] / 60:.1f}" if r.get("wall_s") is not None else "-"
        lines.append(
            f"{row_key(r):<22} {r['epochs']:>6.1f} {r['seed_l1']:>8.3f} {r['seed_l2']:>8.3f} {r['l1']:>7.4f} "
            f"{r['l2']:>7.4f} {r['rel_l1']:>7.4f} {r['rel_l2']:>7.4f} {wall:>10} {load:>9}"
        )
    return "\n".join(lines)


def row_key(row: dict[str, Any]) -> str:
    """A row's name: the model, and ``-VARIANT`` for a variant run with changed settings."""
    return row["model"] + (f"-{row['variant']}" if row.get("variant") else "")


def merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with the rows of ``new`` replaced (by model and variant; new ones added), in Table 1's order,
    each model's own row before its variants."""
    by_key = {row_key(r): r for r in old} | {row_key(r): r for r in new}
    rank = {model: i for i, model in enumerate(SEED)}
    order = sorted(by_key, key=lambda k: (rank.get(by_key[k]["model"], len(rank)), by_key[k].get("variant") or ""))
    return [by_key[k] for k in order]


class LoadSampler:
    """Records the 1-minute load average every ``seconds`` in a background thread, while in a ``with`` block."""

    def __init__(self, seconds: float = 60.0) -> None:
        import threading

        self.seconds, self.samples = seconds, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            self.samples.append(round(os.getloadavg()[0], 2))

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def measured(threads: int) -> Iterator[dict[str, Any]]:
    """A record, filled when the work inside ends, of its wall time, threads, load (at the start, at the end and
    every minute), date and machine."""
    record: dict[str, Any] = {}
    load_start, begin = os.getloadavg(), time.perf_counter()
    with LoadSampler() as load:
        yield record
    record.update(
        wall_s=time.perf_counter() - begin,
        threads=threads,
        loadavg_start=[round(v, 2) for v in load_start],
        loadavg_end=[round(v, 2) for v in os.getloadavg()],
        load_1min_every_minute=load.samples,
        date=time.strftime("%Y-%m-%d"),
        machine=machine(),
    )


def run_row(
    config_file: Path, max_steps: int | None, max_minutes: float | None, variant: str | None, settings: list[str]
) -> tuple[Path, dict]:
    """Train one row (replacing its run folder; a variant's is ``train.out-VARIANT``, trained with ``settings``);
    returns ``(run folder, timing record)``."""
    from eqvit.train.config import load_config
    from eqvit.train.engine import train

    config = with_settings(load_config(config_file), settings)
    out = Path(config.train.out + (f"-{variant}" if variant else ""))
    with measured(config.train.threads) as timing:
        train(config, out, max_steps=max_steps, max_minutes=max_minutes, overwrite=True)
    timing["device"] = config.train.device
    return out, timing


def with_settings(config: Any, settings: list[str]) -> Any:
    """``config`` with ``SECTION.KEY=VALUE`` settings applied (``model.KEY`` is a model keyword), validated
    as a config file is (a bad key or value is a ConfigError naming it)."""
    from eqvit.train.config import ConfigError, ExperimentConfig, from_dict

    data = config.to_dict()
    for item in settings:
        key, sep, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not (sep and dot and name) or section not in data:
            raise ConfigError(f"expected --set SECTION.KEY=VALUE with SECTION one of {', '.join(data)}, got {item!r}")
        target = data["model"]["kwargs"] if section == "model" else data[section]
        target[name] = _value(text)
    return from_dict(ExperimentConfig, data, where="--set")


def _value(text: str) -> Any:
    """A ``--set`` value: YAML, with numbers such as ``3e-3`` (a string to YAML 1.1) read as floats."""
    import yaml

    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def run_probe(name: str, config_file: Path, steps: int, settings: list[str]) -> dict[str, Any]:
    """Train the row's config with ``settings`` for ``steps`` steps (nothing written); its probe row."""
    from eqvit.train.config import load_config
    from eqvit.train.engine import Trainer

    config = load_config(config_file)
    config.train.max_steps, config.train.eval_every = steps, 0  # --set may change them (a plateau schedule)
    config = with_settings(config, settings)
    with measured(config.train.threads) as timing:
        trainer = Trainer(config, progress=False, write=False)
        summary = trainer.fit()
    losses = [h["loss"] for h in trainer.history.train[-50:]]
    metrics = summary["metrics"]
    return {
        "name": name,
        "config": display_path(config_file),
        "settings": list(settings),
        "steps": steps,
        "params": summary["params"],
        **{key: metrics[key] for key in ("l1", "l2", "rel_l1", "rel_l2")},
        "train_loss_last_50": sum(losses) / len(losses),
        **timing,
    }


EXAMPLE_GRIDS = {"64x128": ((64, 128), "equiangular"), "128x256": ((128, 256), "legendre-gauss")}


def example_data(name: str, num: int = 50, seed: int = 333) -> dict[str, Any]:
    """Persistence and the normalisation of torch-harmonics' own shallow-water pipeline on grid ``name``.

    ``PdeDataset`` as its example builds it (global RNG seeded with ``seed``, statistics of one sample), ``num``
    pairs, scored with ``L1LossS2`` / ``L2LossS2``; eqvit's normalisation beside it.
    """
    import torch
    from torch_harmonics.examples import PdeDataset
    from torch_harmonics.examples.losses import L1LossS2, L2LossS2

    from eqvit.data.shallow_water import ShallowWaterConfig, ShallowWaterData

    dims, grid = EXAMPLE_GRIDS[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        data = PdeDataset(dt=3600, nsteps=24, dims=dims, grid=grid, normalize=True, num_examples=num)
        x, y = (torch.stack(t) for t in zip(*(data[i] for i in range(num))))
    l1, l2 = L1LossS2(*dims, grid=grid), L2LossS2(*dims, grid=grid)
    _, eqvit_std = ShallowWaterData(ShallowWaterConfig()).stats
    return {
        "grid": name,
        "quadrature": grid,
        "lmax": int(data.solver.lmax),
        "samples": num,
        "persistence_l1": l1(x, y).item(),
        "persistence_l2": l2(x, y).item(),
        "persistence_l2_per_channel": [l2(x[:, c : c + 1], y[:, c : c + 1]).item() for c in range(3)],
        "example_std": data.inp_var.flatten().sqrt().tolist(),
        "eqvit_std": eqvit_std.tolist(),
    }


def merge_probes(old: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    """``old`` with the probe of ``row``'s name replaced (or appended)."""
    return [r for r in old if r["name"] != row["name"]] + [row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=["so3vit_4x128"], choices=list(CONFIGS))
    parser.add_argument("--max-steps", type=int, default=None, help="stop each row after N steps (smoke tests)")
    parser.add_argument("--max-minutes", type=float, default=None, help="cap each row's training time")
    parser.add_argument("--out", default=str(results_dir() / "swe_table1.json"))
    parser.add_argument("--probe", metavar="NAME", help="a short probe of the first row, written to probes.json")
    parser.add_argument("--steps", type=int, default=150, help="--probe: training steps")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="SECTION.KEY=VALUE", help="--probe / --variant: changed settings"
    )
    parser.add_argument("--variant", help="train the rows with --set settings as variant rows named NAME")
    parser.add_argument(
        "--example-data", action="store_true", help="persistence in torch-harmonics' own pipeline, both grids"
    )
    args = parser.parse_args()

    out = Path(args.out)
    if args.example_data:
        rows = [example_data(name) for name in EXAMPLE_GRIDS]
        path = out.with_suffix("") / "example_data.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=2))
        for r in rows:
            scores = f"l1 {r['persistence_l1']:.4f} l2 {r['persistence_l2']:.4f}"
            print(f"{r['grid']:<8} lmax {r['lmax']:>3}  persistence {scores}")
        print(f"wrote {path}")
        return
    if args.probe:
        row = run_probe(args.probe, config_path(CONFIGS[args.rows[0]]), args.steps, args.set)
        path = out.with_suffix("") / "probes.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        probes = merge_probes(_read(path), row)
        path.write_text(json.dumps(probes, indent=2))
        for r in probes:
            print(f"{r['name']:<16} {r['steps']:>5} steps  l2 {r['l2']:.4f}  rel L2 {r['rel_l2']:.4f}  {r['settings']}")
        print(f"wrote {path}")
        return

    rows = []
    if args.set and not args.variant:
        parser.error("--set changes a row's settings: name the variant with --variant (or use --probe)")
    for name in args.rows:
        config_file = config_path(CONFIGS[name])
        run, timing = run_row(config_file, args.max_steps, args.max_minutes, args.variant, args.set)
        summary = json.loads((run / "metrics.json").read_text())
        variant = {"variant": args.variant, "settings": list(args.set)} if args.variant else {}
        rows.append({**table_row(name, config_file, summary, timing), **variant})
        folder = out.with_suffix("") / row_key(rows[-1])
        folder.mkdir(parents=True, exist_ok=True)
        for artifact in ARTIFACTS:
            if (run / artifact).is_file():
                shutil.copyfile(run / artifact, folder / artifact)
    merged = merge_rows(_read(out), rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2))
    print(format_table(merged))
    print(f"wrote {out} and {out.with_suffix('')}/<row>/")


def _read(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else []


if __name__ == "__main__":
    main()
