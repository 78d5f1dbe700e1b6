"""Data efficiency of O(2)-subgroup ViTs (the seed's Sec. 5.1 / Figure 4): rotated MNIST, or an image folder.

Square grid: D4, C4, D2, C1; hexagonal grid: D6, C6, D3, C1. For every group the number of regular
copies is chosen so that the parameter count is closest to each target (coupled attention, 3 heads,
depth 6, AdamW as in App. F, batch 16).

* **Rotated MNIST** (the shipped stand-in; PatternNet cannot be bundled): 28^2 digits padded to 32^2,
  P^2 patches; hexagonal: the digits resampled bilinearly onto ``HexPatchGrid(4, 5)``.
* **``--image-folder ROOT``** (PatternNet's ``images/``, or any folder with one sub-folder per
  class), at the seed's App. F settings: RGB in [-1, 1], 256x256 with 16x16 patches; hexagonal
  grid ``HexPatchGrid(9, 9)`` (217 patches of 217 pixels) bilinearly resampled from the 256^2 image;
  an 80 / 20 split within each class, nested training subsets; ratios 0.1 / 0.4 / 1.0 with max
  epochs / early-stopping patience 600/60, 150/50, 50/10 (``--seed-schedule`` gives MNIST the same);
  lr 1e-3, no tuning. Each run is the engine's (:class:`~eqvit.train.engine.Trainer` on the lazily
  loaded folder, ``train.patience``, the best checkpoint in ``OUT/runs/KEY/best.safetensors``).
  ``--img-size``, ``--patch-sizes``, ``--hex-grid``, ``--depth``, ``--targets``, ``--epochs`` /
  ``--patience`` shrink it for a smoke run (``--smoke`` does all of that).

Two stages, both in one run:

1. **Tuning on held-out digits** (MNIST; skipped when ``--lrs`` and ``--patch-sizes`` give one
   setting). Every group tries each learning rate in ``--lrs`` and (square grid) each patch size
   in ``--patch-sizes``, trained on the ``--tune-ratio`` subset and scored
   on ``--holdout`` further training digits that no model trains on (``rotated_mnist(holdout=)``).
   The validation set is not touched. Each group keeps its best setting: every model is compared at
   its own best, chosen the same way.
2. **Evaluation.** Each group at its chosen setting is trained on ``sample_ratio`` of the 4,000
   training digits for every seed, keeping the epoch of best validation accuracy (early stopping,
   as in the seed).

Writes ``runs.json`` (every run of both stages and the chosen settings), ``summary.json`` (mean and
std over seeds per grid, group, ratio and target, and each group's gap to C1) and an
accuracy-vs-log10(params) plot per grid and ratio. Runs go to ``--jobs`` worker processes of one
thread each.

Usage: ``python benchmarks/o2_data_efficiency.py [--grids square] [--groups D4 C1] [--targets 20000]``;
``--resume`` skips the runs already in ``runs.json``; ``--smoke`` is a seconds-long check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

import eqvit
from eqvit.bench._paths import results_dir
from eqvit.bench._pool import process_pool
from eqvit.data.images import rotated_mnist
from eqvit.geometry import HexPatchGrid
from eqvit.nn.tokenizers.hexagonal import SquareToHex
from eqvit.train.classify import fit_classifier

GROUPS = {"square": ["D4", "C4", "D2", "C1"], "hex": ["D6", "C6", "D3", "C1"]}
HEX_GRID = (4, 5)
IMG_SIZE = 32
# The seed's App. F schedule: sample ratio -> (max epochs, early-stopping patience).
SEED_SCHEDULE = {0.1: (600, 60), 0.4: (150, 50), 1.0: (50, 10)}
MNIST_SCHEDULE = {0.1: (100, 30), 1.0: (30, 8)}


@dataclass(frozen=True)
class Geometry:
    """The input the models are built for: square side, hexagonal grid, channels, classes."""

    img_size: int = IMG_SIZE
    hex_grid: tuple[int, int] = HEX_GRID
    in_chans: int = 1
    num_classes: int = 10


MNIST = Geometry()
SEED_FOLDER = Geometry(img_size=256, hex_grid=(9, 9), in_chans=3)  # App. F (num_classes: the folder's)


def model_kwargs(
    grid: str,
    group: str,
    copies: int,
    depth: int,
    patch_size: int | None = 8,
    geometry: Geometry = MNIST,
    options: dict | None = None,
) -> tuple[str, dict]:
    """``(registered name, kwargs)`` of the benchmark's model (coupled attention, 3 heads, unless
    ``options`` says otherwise, e.g. ``{"attention": "irrepwise", "irrep_heads": {...}}``)."""
    common = dict(group=group, regular_copies=copies, depth=depth, num_heads=3)
    common.update(in_chans=geometry.in_chans, num_classes=geometry.num_classes, **(options or {}))
    if grid == "square":
        return "o2vit_square_s", dict(img_size=geometry.img_size, patch_size=patch_size, **common)
    side, pixels = geometry.hex_grid
    # the images are resampled onto the hexagons once, in load_data
    return "o2vit_hex_s", dict(img_size=None, n_patch_side=side, n_pixel_side=pixels, **common)


def build(
    grid: str,
    group: str,
    copies: int,
    depth: int,
    patch_size: int | None = 8,
    geometry: Geometry = MNIST,
    options: dict | None = None,
) -> torch.nn.Module:
    name, kwargs = model_kwargs(grid, group, copies, depth, patch_size, geometry, options)
    return eqvit.create_model(name, **kwargs)


@cache  # builds up to ~30 models; every run and ablation cell of a group asks again
def matched_copies(
    grid: str, group: str, target: int, depth: int, patch_size: int | None = 8, geometry: Geometry = MNIST
) -> tuple[int, int]:
    """Regular copies (a multiple of 3, one per head) whose parameter count is closest to ``target``."""
    best = None
    for copies in range(3, 97, 3):
        n = sum(p.numel() for p in build(grid, group, copies, depth, patch_size, geometry).parameters())
        if best is None or abs(np.log(n / target)) < abs(np.log(best[1] / target)):
            best = (copies, n)
        if n > 2 * target:
            break
    return best


def load_data(grid: str, ratio: float, seed: int, holdout: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    data = rotated_mnist(ratio, seed=seed, img_size=IMG_SIZE, holdout=holdout)
    if grid == "hex":
        to_hex = SquareToHex(IMG_SIZE, HexPatchGrid(*HEX_GRID).points)
        data = {k: (to_hex(x), y) for k, (x, y) in data.items()}
    return data


def run_key(run: dict) -> tuple:
    return tuple(run[k] for k in ("stage", "grid", "group", "ratio", "seed", "target", "patch_size", "lr"))


def folder_classes(root: str | Path) -> list[str]:
    """The class sub-folders of an image folder (ValueError when there are none)."""
    root = Path(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not classes:
        raise ValueError(f"expected a folder with one sub-folder of images per class, got {str(root)!r}")
    return classes


def folder_config(spec: dict, geometry: Geometry, copies: int):
    """The engine config of one folder run: the seed's App. F (AdamW, wd 0.05, constant lr, no clipping),
    validation every epoch, early stopping on validation accuracy after ``patience`` epochs."""
    from eqvit.train.config import DataConfig, ExperimentConfig, ModelConfig, OptimConfig, ScheduleConfig, TrainConfig

    name, kwargs = model_kwargs(
        spec["grid"], spec["group"], copies, spec["depth"], spec["patch_size"], geometry, spec.get("model_options")
    )
    return ExperimentConfig(
        model=ModelConfig(name=name, kwargs=kwargs),
        data=DataConfig(
            name="image_folder", root=spec["image_folder"], sample_ratio=spec["ratio"], img_size=geometry.img_size,
            val_fraction=0.2, split_seed=0, batch_size=spec["batch_size"], val_batch_size=64, seed=spec["seed"],
        ),
        optim=OptimConfig(name="adamw", lr=spec["lr"], weight_decay=0.05, grad_clip=None),
        schedule=ScheduleConfig(name="constant"),
        train=TrainConfig(
            max_epochs=spec["epochs"], eval_every=0, eval_every_epochs=1, patience=spec["patience"],
            monitor="accuracy", seed=spec["seed"], threads=spec["threads"], device=spec["device"],
            log_every=10**9, out=spec["out"],
        ),
    )  # fmt: skip


def train_folder_run(spec: dict, geometry: Geometry, copies: int) -> dict:
    """One run on the image folder through the engine (lazy loading, early stopping, best.safetensors)."""
    from eqvit.train.engine import Trainer

    trainer = Trainer(folder_config(spec, geometry, copies), progress=False)
    summary = trainer.fit()
    spe = trainer.task.steps_per_epoch
    return dict(
        accuracy=summary["monitor"]["best"],
        best_epoch=-(-summary["best_step"] // spe),
        epochs_run=round(summary["epochs"]),
        stopped_early=summary["stopped_early"],
        train_size=len(trainer.task.train_set),
        val_size=len(trainer.task.val_set),
        params=summary["params"],
    )


def train_run(spec: dict) -> dict:
    """Train one model; in the tuning stage the epoch is chosen on (and the score is) the holdout digits."""
    torch.set_num_threads(spec["threads"])
    geometry = Geometry(**{**spec["geometry"], "hex_grid": tuple(spec["geometry"]["hex_grid"])})
    if spec.get("image_folder"):
        copies, params = matched_copies(
            spec["grid"], spec["group"], spec["target"], spec["depth"], spec["patch_size"], geometry
        )
        start = time.perf_counter()
        result = {k: v for k, v in spec.items() if k not in ("threads", "holdout", "out", "device")}
        result.update(copies=copies, **train_folder_run(spec, geometry, copies))
        result["seconds"] = time.perf_counter() - start
        return result
    tuning = spec["stage"] == "tune"
    data = load_data(spec["grid"], spec["ratio"], spec["seed"], spec["holdout"] if tuning else 0)
    copies, params = matched_copies(spec["grid"], spec["group"], spec["target"], spec["depth"], spec["patch_size"])
    torch.manual_seed(spec["seed"])
    model = build(spec["grid"], spec["group"], copies, spec["depth"], spec["patch_size"])
    start = time.perf_counter()
    _, history = fit_classifier(
        model,
        data["train"],
        data["holdout" if tuning else "val"],
        epochs=spec["epochs"],
        batch_size=spec["batch_size"],
        lr=spec["lr"],
        patience=spec["patience"],
        seed=spec["seed"],
    )
    result = {k: v for k, v in spec.items() if k not in ("threads", "holdout", "out", "device")}
    result.update(
        copies=copies,
        params=params,
        accuracy=history.best_accuracy,  # holdout accuracy when tuning, validation accuracy otherwise
        best_epoch=history.best_epoch + 1,
        epochs_run=history.epochs,
        train_size=len(data["train"][1]),
        seconds=time.perf_counter() - start,
    )
    if tuning:
        result["holdout_size"] = len(data["holdout"][1])
    return result


def choose(tuning: list[dict]) -> dict[tuple, dict]:
    """``(grid, group, target) -> {"patch_size", "lr", "holdout_accuracy"}``: the best mean holdout accuracy."""
    scores: dict[tuple, dict[tuple, list[float]]] = {}
    for r in tuning:
        scores.setdefault((r["grid"], r["group"], r["target"]), {}).setdefault((r["patch_size"], r["lr"]), [])
        scores[(r["grid"], r["group"], r["target"])][(r["patch_size"], r["lr"])].append(r["accuracy"])
    chosen = {}
    for key, by_setting in scores.items():
        (patch, lr), accs = max(by_setting.items(), key=lambda kv: np.mean(kv[1]))
        chosen[key] = dict(patch_size=patch, lr=lr, holdout_accuracy=float(np.mean(accs)))
    return chosen


def run_all(specs: list[dict], jobs: int, runs: list[dict], save) -> None:
    """Run ``specs`` (in ``jobs`` processes when > 1), appending each result to ``runs`` and saving."""
    if jobs == 1:
        results = map(train_run, specs)
    else:
        pool = process_pool(jobs)
        results = pool.map(train_run, specs)
    for result in results:
        runs.append(result)
        print(json.dumps(result), flush=True)
        save()
    if jobs > 1:
        pool.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--image-folder", type=Path, default=None, metavar="ROOT",
        help="a PatternNet-style folder (one sub-folder per class) instead of rotated MNIST, at the seed's settings",
    )  # fmt: skip
    parser.add_argument(
        "--seed-schedule", action="store_true",
        help="the seed's ratios 0.1 / 0.4 / 1.0 with epochs / patience 600/60, 150/50, 50/10 (default with "
        "--image-folder)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ratios", type=float, nargs="+", default=None, help="sample ratios (default: see above)")
    parser.add_argument("--targets", type=int, nargs="+", default=[20_000, 60_000])
    parser.add_argument(
        "--epochs", type=int, nargs="+", default=None, help="maximum epochs: one value, or one per --ratios entry"
    )
    parser.add_argument(
        "--patience", type=int, nargs="+", default=None, help="early stopping: one value, or one per --ratios entry"
    )
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--grids", nargs="+", default=["square", "hex"], choices=list(GROUPS))
    parser.add_argument(
        "--groups",
        nargs="+",
        default=None,
        help="only these groups (each on the grids whose family holds it; default: all)",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--lrs", type=float, nargs="+", default=None,
        help="learning rates tried when tuning (default 1e-3 3e-3; with --image-folder the seed's 1e-3)",
    )  # fmt: skip
    parser.add_argument(
        "--patch-sizes", type=int, nargs="+", default=None,
        help="square patch sizes tried (default 4 8; with --image-folder the seed's 16)",
    )  # fmt: skip
    parser.add_argument("--img-size", type=int, default=None, help="--image-folder: square side (default 256)")
    parser.add_argument(
        "--hex-grid", type=int, nargs=2, default=None, metavar=("N1", "N2"),
        help="--image-folder: hexagonal patches per side and pixels per patch side (default 9 9)",
    )  # fmt: skip
    parser.add_argument("--tune-ratio", type=float, default=0.1, help="sample ratio of the tuning runs")
    parser.add_argument("--tune-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--holdout", type=int, default=1000, help="held-out training digits that score the tuning")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes, one thread each")
    parser.add_argument("--device", default="cpu", help="--image-folder runs: cpu, cuda, cuda:N")
    parser.add_argument("--resume", action="store_true", help="skip the runs already in OUT/runs.json")
    parser.add_argument(
        "--report-only", action="store_true", help="only rewrite summary.json and the plot from OUT/runs.json"
    )
    parser.add_argument(
        "--smoke", action="store_true",
        help="one seed, one epoch, depth 1, tiny data (with --image-folder: 32^2 images, 8^2 patches, hex grid 2 4)",
    )  # fmt: skip
    parser.add_argument(
        "--plan", action="store_true", help="print the runs (settings, schedule, geometry) as JSON and exit"
    )
    parser.add_argument("--out", default=None, help="default benchmarks/results/o2_data_efficiency[_folder]")
    args = parser.parse_args(argv)
    folder = args.image_folder
    if folder is not None:
        try:
            classes = folder_classes(folder)
        except ValueError as err:
            parser.error(f"--image-folder: {err}")
    seed_schedule = args.seed_schedule or folder is not None
    schedule = SEED_SCHEDULE if seed_schedule else MNIST_SCHEDULE
    if args.ratios is None:
        args.ratios = list(schedule)
    given_schedule = args.epochs is not None or args.patience is not None
    if args.epochs is None or args.patience is None:
        missing = [r for r in args.ratios if r not in schedule]
        if missing:
            parser.error(f"--ratios {missing} have no default schedule; give --epochs and --patience")
        args.epochs = args.epochs or [schedule[r][0] for r in args.ratios]
        args.patience = args.patience or [schedule[r][1] for r in args.ratios]
    args.lrs = args.lrs or ([1e-3] if folder is not None else [1e-3, 3e-3])
    args.patch_sizes = args.patch_sizes or ([16] if folder is not None else [4, 8])
    if folder is None and (args.img_size is not None or args.hex_grid is not None):
        parser.error("--img-size and --hex-grid set the --image-folder geometry (rotated MNIST is 32^2, hex 4 5)")
    if args.smoke:
        args.seeds, args.depth, args.targets, args.tune_ratio, args.holdout = [0], 1, [5_000], 0.01, 40
        if not given_schedule:
            args.epochs, args.patience = [1] * len(args.ratios), [1] * len(args.ratios)
        if folder is None:
            args.ratios, args.epochs, args.patience = [0.01], [1], [1]
        else:
            args.img_size, args.hex_grid, args.patch_sizes = args.img_size or 32, args.hex_grid or [2, 4], [8]
    geometry = MNIST
    if folder is not None:
        geometry = Geometry(
            img_size=args.img_size or SEED_FOLDER.img_size,
            hex_grid=tuple(args.hex_grid or SEED_FOLDER.hex_grid),
            in_chans=3,
            num_classes=len(classes),
        )
        if "square" in args.grids:
            bad = [p for p in args.patch_sizes if geometry.img_size % p]
            if bad:
                parser.error(f"--patch-sizes {bad} do not divide --img-size {geometry.img_size}")
    tune = len(args.lrs) > 1 or len(args.patch_sizes) > 1
    if tune and folder is not None:
        parser.error(
            "--image-folder runs at one setting (the seed's lr 1e-3, 16^2 patches): give one --lrs and one "
            "--patch-sizes value (tuning needs the held-out MNIST digits)"
        )

    def per_ratio(name: str, values: list[int]) -> dict[float, int]:
        if len(values) not in (1, len(args.ratios)):
            parser.error(f"--{name} takes one value or one per ratio ({len(args.ratios)}), got {values}")
        return dict(zip(args.ratios, values * len(args.ratios) if len(values) == 1 else values))

    epochs_at, patience_at = per_ratio("epochs", args.epochs), per_ratio("patience", args.patience)
    unknown = [g for g in args.groups or [] if not any(g in GROUPS[grid] for grid in args.grids)]
    if unknown:
        families = "; ".join(f"{grid}: {' '.join(GROUPS[grid])}" for grid in args.grids)
        parser.error(f"--groups {unknown} are in none of the grids' families ({families})")
    if args.tune_ratio not in epochs_at:
        epochs_at[args.tune_ratio], patience_at[args.tune_ratio] = max(args.epochs), max(args.patience)
    default_out = "o2_data_efficiency" if folder is None else f"o2_data_efficiency_{folder.resolve().name}"
    out = Path(args.out) if args.out else results_dir() / default_out
    if not args.plan:
        out.mkdir(parents=True, exist_ok=True)
    invocation = {k: v for k, v in vars(args).items() if k not in ("out", "resume", "smoke", "report_only")} | {
        "image_folder": str(folder) if folder is not None else None,
        "dataset": "rotated_mnist (stand-in)" if folder is None else f"image folder {folder} ({len(classes)} classes)",
        "geometry": asdict(geometry),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "loadavg_start": os.getloadavg(),
    }
    previous = json.loads((out / "runs.json").read_text()) if (out / "runs.json").is_file() else {}
    if args.report_only:
        report(previous["runs"], previous["settings"], out, previous.get("chosen", []))
        return
    runs, settings = [], [invocation]
    if args.resume and previous:
        runs, settings = previous["runs"], previous["settings"] + [invocation]
    done = {run_key(r) for r in runs}

    def spec(stage: str, grid: str, group: str, ratio: float, seed: int, target: int, patch, lr: float) -> dict:
        key = f"{grid}-{group}-r{ratio:g}-t{target}-p{patch}-lr{lr:g}-seed{seed}"
        return dict(
            stage=stage, grid=grid, group=group, ratio=ratio, seed=seed, target=target, patch_size=patch, lr=lr,
            epochs=epochs_at[ratio], patience=patience_at[ratio], batch_size=args.batch_size, depth=args.depth,
            holdout=args.holdout, threads=1, geometry=asdict(geometry),
            image_folder=str(folder) if folder is not None else None, device=args.device,
            out=str(out / "runs" / key),
        )  # fmt: skip

    def save(chosen: dict | None = None) -> None:
        rows = [dict(grid=k[0], group=k[1], target=k[2], **v) for k, v in (chosen or {}).items()]
        (out / "runs.json").write_text(json.dumps({"settings": settings, "chosen": rows, "runs": runs}, indent=2))

    wall = time.perf_counter()
    cells = [
        (grid, group, t)
        for grid in args.grids
        for group in GROUPS[grid]
        if args.groups is None or group in args.groups
        for t in args.targets
    ]
    tune_specs = [
        spec("tune", grid, group, args.tune_ratio, seed, target, patch if grid == "square" else None, lr)
        for grid, group, target in cells
        for patch in (args.patch_sizes if grid == "square" else [None])
        for lr in args.lrs
        for seed in args.tune_seeds
    ] if tune else []  # fmt: skip
    single = {
        (grid, group, target): dict(
            patch_size=args.patch_sizes[0] if grid == "square" else None, lr=args.lrs[0], holdout_accuracy=None
        )
        for grid, group, target in cells
    }
    if args.plan:  # the tuning runs, or (one setting) the evaluation runs
        plan = tune_specs or [
            spec("eval", grid, group, ratio, seed, target, single[grid, group, target]["patch_size"], args.lrs[0])
            for grid, group, target in cells
            for ratio in args.ratios
            for seed in args.seeds
        ]
        print(json.dumps({"settings": invocation, "tune": tune, "runs": plan}, indent=2, default=str))
        return
    if tune:
        run_all([s for s in tune_specs if run_key(s) not in done], args.jobs, runs, save)
        chosen = choose([r for r in runs if r["stage"] == "tune" and run_key(r) in {run_key(s) for s in tune_specs}])
    else:  # one setting: nothing to choose
        chosen = single
    save(chosen)
    eval_specs = [
        spec("eval", grid, group, ratio, seed, target, chosen[grid, group, target]["patch_size"],
             chosen[grid, group, target]["lr"])
        for grid, group, target in cells
        for ratio in args.ratios
        for seed in args.seeds
    ]  # fmt: skip
    run_all([s for s in eval_specs if run_key(s) not in done], args.jobs, runs, lambda: save(chosen))
    print(f"wall time {time.perf_counter() - wall:.0f} s, load average {os.getloadavg()}")
    settings[-1]["loadavg_end"] = os.getloadavg()
    save(chosen)
    evaluated = {run_key(s) for s in eval_specs}
    report([r for r in runs if run_key(r) in evaluated], settings, out, chosen)


def report(runs: list[dict], settings: list[dict], out: Path, chosen: dict | list) -> None:
    """Summarise the evaluation runs into ``summary.json``, a printed table and the plot."""
    runs = [r for r in runs if r.get("stage", "eval") == "eval"]
    if isinstance(chosen, dict):
        chosen = [dict(grid=k[0], group=k[1], target=k[2], **v) for k, v in chosen.items()]
    summary = summarise(runs)
    (out / "summary.json").write_text(
        json.dumps({"settings": settings, "chosen": chosen, "summary": summary}, indent=2)
    )
    for c in chosen:
        if c.get("holdout_accuracy") is None:
            continue  # one setting, not tuned
        print(
            f"chosen on {c['grid']} {c['group']} (target {c['target']}): patch {c['patch_size']}, lr {c['lr']:g} "
            f"(holdout accuracy {100 * c['holdout_accuracy']:.1f} %)"
        )
    print_summary(summary)
    plot(runs, out)


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
                patch_size=sel[0].get("patch_size"),
                lr=sel[0].get("lr"),
                epochs_mean=float(np.mean([r.get("epochs_run", r["epochs"]) for r in sel])),
                best_epoch_mean=float(np.mean([r["best_epoch"] for r in sel])),
                seconds_mean=float(np.mean([r["seconds"] for r in sel])),
                stopped_early=int(sum(bool(r.get("stopped_early")) for r in sel)),
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
        f"{'grid':<7} {'ratio':>5} {'target':>7} {'group':<5} {'patch':>5} {'lr':>6} {'params':>7} {'seeds':>5} "
        f"{'accuracy (%)':>14} {'vs C1':>6} {'epochs':>6} {'best ep':>7} {'stopped':>7} {'s/run':>6}"
    )
    for r in rows:
        gap = f"{r['gap_to_C1_points']:+.1f}" if r["gap_to_C1_points"] is not None else ""
        print(
            f"{r['grid']:<7} {r['ratio']:>5} {r['target']:>7} {r['group']:<5} {r['patch_size'] or '-'!s:>5} "
            f"{r['lr'] or 0:>6g} {r['params']:>7} {len(r['seeds']):>5} "
            f"{r['accuracy_mean']:>7.2f} ± {r['accuracy_std']:<4.2f} {gap:>6} {r['epochs_mean']:>6.0f} "
            f"{r['best_epoch_mean']:>7.0f} {r.get('stopped_early', 0):>7} {r['seconds_mean']:>6.0f}"
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
