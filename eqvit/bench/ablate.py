"""Cross-group ablations, one command each: ``python benchmarks/ablate.py TASK [--quick]``.

TASK is one of

- ``swe``: shallow water on the rotating sphere. SO3ViT (SO(3)-RoPE), the same ViT without a
  positional scheme, Platonic frames I / O / T on the icosphere patches, a learned-APE ViT and
  torch-harmonics' S2Transformer, at matched parameter budgets (each Platonic width is chosen so
  its parameter count is closest to SO3ViT 4x128's), trained for equal wall-clock time in
  interleaved rounds. Relative L1/L2, polar error ratio, forward time (batch 1, interleaved),
  peak training memory (batch 4, fresh process each); a Pareto plot of L2 against the time per
  training step (the SO(3)-RoPE seed's Figure 2) and the error maps side by side (its Figure 3).
- ``points``: Platonic trivial / T / O / I frames on the synthetic shapes (see
  ``benchmarks/platonic_pointcloud.py``), trained and tested under random SO(3) rotations.
- ``attention``: the O(2) seed's Sec. 5.2 (Figure 5): coupled against irrep-wise attention for C4
  with V = 4q regular copies and the Table 1 head layout (four heads of 4q features each;
  ``irrep_heads={"A": 1, "B": 1, "E1": 2}``), q in ``--qs``, sample ratios 0.1 and 1.0, on rotated
  MNIST (the stand-in) and, with ``--image-folder``, on the folder at 256^2 / 16^2 patches RGB
  through the engine (the seed's epochs / patience 600/60 and 200/30).
- ``images``: rotated MNIST, O(2) ViTs (square D4, C4, D2, C1; hexagonal D6, C6, D3; coupled and
  irrep-wise attention), Platonic C4 / D4 and a timm ViT at sample ratios 0.1 and 1.0 over seeds;
  accuracy against log10(params) (the O(2) seed's Figures 4-5). ``--image-folder DIR`` adds a
  PatternNet-style folder.

Every run is a *cell* saved as JSON under ``OUT/TASK/cells/`` as soon as it finishes, so an
interrupted ablation resumes from the finished cells; the ``swe`` trainings also checkpoint every
model after each interleaved round and resume from there. At the end each task writes
``results.json``, ``results.md`` (a table) and PNG plots into ``OUT/TASK/``. ``--quick`` shortens
every run for CI-sized checks (each task under 15 minutes on 2 CPU cores).

Usage::

    python benchmarks/ablate.py swe --quick
    python benchmarks/ablate.py points
    python benchmarks/ablate.py images --seeds 0 1 2
    eqvit bench ablate swe --quick        # the same through the CLI
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eqvit.bench import so3vit_vs_s2transformer as speed
from eqvit.bench._paths import config_path, results_dir

DEFAULT_OUT = results_dir() / "ablate"


# ------------------------------------------------------------------------------------------------
# cells: one finished run each, stored as JSON so that a rerun resumes


@dataclass
class CellStore:
    """Finished cells of one task under ``folder / "cells"``."""

    folder: Path
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        (self.folder / "cells").mkdir(parents=True, exist_ok=True)
        for path in sorted((self.folder / "cells").glob("*.json")):
            self.cells[path.stem] = json.loads(path.read_text())

    def done(self, key: str) -> bool:
        return key in self.cells

    def put(self, key: str, result: dict[str, Any]) -> None:
        path = self.folder / "cells" / f"{key}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(path)  # atomic: a killed run never leaves half a cell
        self.cells[key] = result


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def past_invocations(folder: Path) -> list[dict[str, Any]]:
    """The runs that produced ``folder``'s cells so far, from its previous ``results.json``.

    A resumed ablation (or a rerun that only redraws the report) appends to this history instead of
    replacing the machine, load and wall time of the runs that did the work.
    """
    path = folder / "results.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    if "invocations" in old:
        return old["invocations"]
    if "machine" in old:  # results written before the history was kept: one run, cells unknown
        return [{"machine": old["machine"], "wall_minutes": old.get("wall_minutes"), "cells_added": None}]
    return []


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ------------------------------------------------------------------------------------------------
# swe: shallow water on the rotating sphere


# label -> (registered model, kwargs). All predict the next state residually; sphere models on the
# icosphere break symmetry with the latitude encoding (the Coriolis force keeps only z-rotations).
SWE_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "SO3ViT (SO(3)-RoPE)": ("so3vit_4x128", {"symmetry_breaking": "latitude", "residual": True}),
    "SO3ViT, no posenc": ("so3vit_4x128", {"symmetry_breaking": "latitude", "residual": True, "posenc": "none"}),
    "Platonic I": ("platonic_sphere_4x128", {"group": "I", "symmetry_breaking": "latitude", "residual": True}),
    "Platonic O": ("platonic_sphere_4x128", {"group": "O", "symmetry_breaking": "latitude", "residual": True}),
    "Platonic T": ("platonic_sphere_4x128", {"group": "T", "symmetry_breaking": "latitude", "residual": True}),
    "ViT + APE": ("vit_ape_4x128", {"residual": True}),
    "S2Transformer": ("s2transformer_4x128", {"residual": True}),
}
SWE_REFERENCE = "SO3ViT (SO(3)-RoPE)"


def count_params(name: str, kwargs: dict[str, Any]) -> int:
    import eqvit

    return speed.count_params(eqvit.create_model(name, **kwargs))


def matched_platonic_width(group: str, target: int, kwargs: dict[str, Any]) -> tuple[int, int]:
    """The valid Platonic sphere width (multiple of 2|G|) whose parameter count is closest to ``target``."""
    from eqvit.models.platonic import sphere_frames

    step = 2 * sphere_frames(group)[0].order
    best: tuple[int, int] | None = None
    width = step
    while True:
        n = count_params("platonic_sphere_4x128", dict(kwargs, embed_dim=width))
        if best is None or abs(math.log(n / target)) < abs(math.log(best[1] / target)):
            best = (width, n)
        if n > target:
            return best
        width += step


def swe_specs() -> dict[str, tuple[str, dict[str, Any]]]:
    """The models with the Platonic widths matched to the reference's parameter count."""
    specs = copy.deepcopy(SWE_MODELS)
    ref_name, ref_kwargs = specs[SWE_REFERENCE]
    target = count_params(ref_name, ref_kwargs)
    for name, kwargs in specs.values():
        if name.startswith("platonic_sphere"):
            kwargs["embed_dim"], _ = matched_platonic_width(kwargs["group"], target, kwargs)
    return specs


def spec_string(name: str, kwargs: dict[str, Any]) -> str:
    """``name{json kwargs}``: how the timing and memory helpers build a model."""
    return name + json.dumps(kwargs, sort_keys=True)


def run_swe(args: argparse.Namespace, store: CellStore) -> dict[str, Any]:
    from eqvit.train.config import load_config
    from eqvit.train.engine import Trainer
    from eqvit.train.rollout import rollout, rollout_json, save_maps

    specs = swe_specs()
    minutes = args.minutes if args.minutes is not None else (1.0 if args.quick else 20.0)
    base = load_config(config_path("swe_accuracy.yaml"))
    if args.quick:
        base.data.num_val = 4
    pending = [label for label in specs if not store.done(f"train-{slug(label)}")]
    trainers: dict[str, Trainer] = {}
    for label in pending:
        name, kwargs = specs[label]
        cfg = copy.deepcopy(base)
        cfg.model.name, cfg.model.kwargs = name, dict(kwargs)
        trainer = trainers[label] = Trainer(cfg, out_dir=store.folder / "runs" / slug(label), progress=False)
        if trainer.resume():  # an interrupted ablation goes on from the last finished round
            print(f"{label}: resumed at step {trainer.step} ({trainer.train_seconds:.0f} s trained)", flush=True)
        trainer.start(max_minutes=minutes)
    # Interleaved rounds: load from other jobs hits every model alike (equal wall-clock budgets).
    # Every model is checkpointed after each round, so a stopped run loses at most one round.
    slice_s = min(60.0, minutes * 60 / 4)
    while trainers and not all(t.done for t in trainers.values()):
        for trainer in trainers.values():
            if not trainer.done:
                trainer.train_for(slice_s)
                trainer.save()
        print(" | ".join(f"{label}: {t.step} steps" for label, t in trainers.items()), flush=True)
    for label, trainer in trainers.items():
        summary = trainer.finish()
        error_map = trainer.final_evaluation["error_map"]
        curves = rollout(trainer.model, trainer.task, args.rollout) if args.rollout > 0 else None
        if curves is not None:
            save_maps(curves, rollout_maps_path(store, label))
        # beside the cells (committed), not under runs/ (checkpoints, ignored): the report redraws from it
        np.save(error_map_path(store, label), error_map.numpy().astype(np.float32))
        store.put(
            f"train-{slug(label)}",
            {
                "label": label,
                "model": specs[label][0],
                "kwargs": specs[label][1],
                "params": summary["params"],
                "steps": summary["steps"],
                "minutes": minutes,
                "seconds_per_step": summary["seconds_per_step"],
                "metrics": summary["metrics"],
                "persistence": summary.get("persistence"),
                "on_grid": trainer.task.on_grid,
                "rollout": rollout_json(curves) if curves is not None else None,
                "machine": machine(),
            },
        )
    if not store.done("speed"):
        store.put("speed", swe_speed(specs, args))
    return swe_report(specs, args, store, minutes)


def swe_speed(specs: dict[str, tuple[str, dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """Forward time (interleaved rounds, batch 1) and peak training memory (fresh process each)."""
    strings = {label: spec_string(*spec) for label, spec in specs.items()}
    repeats = {
        s: (2 if args.quick else 10) if s.startswith("s2transformer") else (3 if args.quick else 30)
        for s in strings.values()
    }
    device = torch.device(args.device)
    timing = speed.time_forward(
        list(strings.values()), repeats, warmup=1 if args.quick else 3, device=device, amp=args.amp
    )
    mem_args = argparse.Namespace(
        device=args.device,
        batch_size=4,
        train_steps=1 if args.quick else 3,
        threads=torch.get_num_threads(),
        amp=args.amp,
    )
    out = {}
    for label, s in strings.items():
        memory = speed.measure_memory(s, mem_args)
        out[label] = {
            "forward_ms": statistics.median(t["ms"] for t in timing["raw"][s]),
            "forward_runs": len(timing["raw"][s]),
            "peak_train_mb": memory.get("peak_mb"),
            "memory_method": memory.get("method", memory.get("error")),
        }
    out["machine"] = machine()
    return out


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label.lower()).strip("_")


def swe_report(specs: dict, args: argparse.Namespace, store: CellStore, minutes: float) -> dict[str, Any]:
    speed_cell = store.cells["speed"]
    rows = []
    for label in specs:
        cell = store.cells[f"train-{slug(label)}"]
        m = cell["metrics"]
        rows.append(
            {
                "label": label,
                "model": cell["model"],
                "params": cell["params"],
                "steps": cell["steps"],
                "seconds_per_step": cell["seconds_per_step"],
                "rel_l2": m["rel_l2"],
                "rel_l1": m["rel_l1"],
                "polar_error_ratio": m["polar_error_ratio"],
                "forward_ms": speed_cell[label]["forward_ms"],
                "peak_train_mb": speed_cell[label]["peak_train_mb"],
            }
        )
    persistence = store.cells[f"train-{slug(SWE_REFERENCE)}"]["persistence"]
    header = "| model | params | steps | s/step | rel L2 | rel L1 | polar ratio | forward ms | peak train MB |"
    lines = [
        f"Shallow water, equal wall-clock ({minutes:g} min per model), matched parameter budgets.",
        "",
        header,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mem = f"{r['peak_train_mb']:.0f}" if r["peak_train_mb"] is not None else "-"
        lines.append(
            f"| {r['label']} | {r['params'] / 1e6:.3f}M | {r['steps']} | {r['seconds_per_step']:.2f} | "
            f"{r['rel_l2']:.4f} | {r['rel_l1']:.4f} | {r['polar_error_ratio']:.3f} | {r['forward_ms']:.1f} | {mem} |"
        )
    if persistence:
        lines.append(
            f"| persistence | - | - | - | {persistence['rel_l2']:.4f} | {persistence['rel_l1']:.4f} | "
            f"{persistence['polar_error_ratio']:.3f} | - | - |"
        )
    plots = [swe_pareto_plot(rows, store.folder), swe_error_maps(specs, store), swe_rollout_plot(specs, store)]
    return {"rows": rows, "persistence": persistence, "minutes": minutes, "table": "\n".join(lines), "plots": plots}


def swe_pareto_plot(rows: list[dict[str, Any]], folder: Path) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    span = max(r["rel_l2"] for r in rows) - min(r["rel_l2"] for r in rows) or 1.0
    placed: list[tuple[float, float]] = []
    for r in sorted(rows, key=lambda r: -r["rel_l2"]):
        x, y = r["seconds_per_step"], r["rel_l2"]
        ax.scatter(x, y, s=40)
        # labels of near-coincident points stack downwards instead of printing over each other
        crowd = sum(abs(np.log10(x / px)) < 0.3 and abs(y - py) < 0.06 * span for px, py in placed)
        placed.append((x, y))
        ax.annotate(r["label"], (x, y), fontsize=8, xytext=(6, 3 - 11 * crowd), textcoords="offset points")
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())  # decade labels only: minor labels overlap
    ax.set_xlabel("training time per step, batch 4 [s] (log)")
    ax.set_ylabel("relative L2 error (validation)")
    ax.set_title("Shallow water: error vs cost at equal wall-clock")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = folder / "pareto_l2_vs_time.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path.name


def nearest_vertex_raster(vertices: np.ndarray, nlat: int = 180, nlon: int = 360) -> np.ndarray:
    """int ``[nlat, nlon]``: the vertex nearest to each cell centre of a lon/lat raster (north up)."""
    lat = np.radians(90 - (np.arange(nlat) + 0.5) * 180 / nlat)
    lon = np.radians((np.arange(nlon) + 0.5) * 360 / nlon)
    lat, lon = np.meshgrid(lat, lon, indexing="ij")
    cells = np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], -1).reshape(-1, 3)
    index = np.concatenate([np.argmax(chunk @ vertices.T, axis=1) for chunk in np.array_split(cells, 64)])
    return index.reshape(nlat, nlon)


def error_map_path(store: CellStore, label: str) -> Path:
    """Where one model's final error map ``[V]`` is kept, next to its training cell."""
    return store.folder / "cells" / f"error_map-{slug(label)}.npy"


def find_error_map(store: CellStore, label: str) -> Path | None:
    """The saved error map of one model, or None; runs/ is where results from before the maps
    moved beside the cells keep theirs."""
    for path in (error_map_path(store, label), store.folder / "runs" / slug(label) / "error_map.npy"):
        if path.exists():
            return path
    return None


def swe_error_maps(specs: dict, store: CellStore) -> str:
    """Mean absolute error of every model on one colour scale: filled triangles (grid cells for the
    S2Transformer, on its own grid), Mollweide, as in the SO(3)-RoPE seed's Fig. 3."""
    from eqvit.train.metrics import plot_sphere_maps

    paths = {label: find_error_map(store, label) for label in specs}
    missing = [label for label, p in paths.items() if p is None]
    if missing:
        print(f"error maps not found for {missing}: error_maps.png not redrawn", flush=True)
        return "error_maps.png"
    panels = [dict(title=label, values=np.load(path)) for label, path in paths.items()]
    plot_sphere_maps(panels, store.folder / "error_maps.png", cols=2)
    return "error_maps.png"


def rollout_maps_path(store: CellStore, label: str) -> Path:
    return store.folder / "cells" / f"rollout_maps-{slug(label)}.npz"


def swe_rollout_plot(specs: dict, store: CellStore) -> str:
    """``rollout.png``: every model's autoregressive rollout error against lead time, and its maps."""
    from eqvit.train.rollout import load_maps, plot_rollout_comparison

    results = {}
    for label in specs:
        curves = store.cells[f"train-{slug(label)}"].get("rollout")
        path = rollout_maps_path(store, label)
        if curves is None or not path.exists():
            print(f"no rollout for {label}: rollout.png not redrawn", flush=True)
            return "rollout.png"
        results[label] = dict(curves, maps=load_maps(path))
    plot_rollout_comparison(results, store.folder / "rollout.png", title="Shallow water: autoregressive rollouts")
    return "rollout.png"


# ------------------------------------------------------------------------------------------------
# points: Platonic frames on the synthetic shapes (the training loop of platonic_pointcloud.py)


def points_settings(args: argparse.Namespace) -> argparse.Namespace:
    """The settings ``platonic_pointcloud.run_one`` reads: that benchmark's own defaults (equal width
    |G| C = 480 for every group, trained and validated on SO(3)-rotated shapes), less data with --quick."""
    from eqvit.bench import platonic_pointcloud as pp

    full = pp.SETTINGS
    quick = dict(full, train=300, val=60, test=100, epochs=12)
    return argparse.Namespace(**(quick if args.quick else full))


def run_points(args: argparse.Namespace, store: CellStore) -> dict[str, Any]:
    from eqvit.bench import platonic_pointcloud as pp

    settings = points_settings(args)
    seeds = args.seeds[:2] if args.quick else args.seeds
    for seed in seeds:  # seeds outermost: a partial run still compares every group
        for group in pp.GROUPS:
            key = f"{group}-seed{seed}"
            if not store.done(key):
                row = pp.run_one(group, seed, settings)
                store.put(key, row)
                print(f"{key}: rotated test {row['test_so3']:.3f}, upright {row['test_none']:.3f}", flush=True)
    rows = [store.cells[f"{g}-seed{s}"] for s in seeds for g in pp.GROUPS]
    summary = pp.summarise(rows, list(pp.GROUPS))
    meta = dict(vars(settings), seeds=seeds, quick=args.quick, num_classes=10)
    meta.update(wall_s=sum(r["total_s"] for r in rows), loadavg_end=[round(v, 2) for v in os.getloadavg()])
    meta.update(test_rotate=["so3", "none"], orders={r["group"]: r["group_order"] for r in rows})
    pp.plot(summary, rows, store.folder / "accuracy.png", meta)
    return {"summary": summary, "settings": meta, "table": pp.markdown(summary, meta), "plots": ["accuracy.png"]}


# ------------------------------------------------------------------------------------------------
# images: rotated MNIST (and an optional image folder) across the O(2) and Platonic families


IMAGE_PATCH = 8  # 8^2 patches of the 32^2 digits: the patch size the O(2) tuning picks (o2_data_efficiency.py)
IMAGE_WIDTH = 48  # the Platonic and timm image models' embedding width


def platonic_image_model(group: str, in_chans: int, num_classes: int, depth: int, **kwargs: Any) -> torch.nn.Module:
    """The ablation's Platonic image classifier: width 48, 8^2 patches of the 32^2 image."""
    import eqvit

    return eqvit.create_model(
        "platonic_image_s", group=group, embed_dim=IMAGE_WIDTH, depth=depth, in_chans=in_chans,
        num_classes=num_classes, img_size=32, patch_size=IMAGE_PATCH, **kwargs,
    )  # fmt: skip


def timm_image_vit(in_chans: int, num_classes: int, depth: int) -> torch.nn.Module:
    """The ablation's plain ViT: timm's, at the Platonic width, average-pooled, no class token."""
    import timm

    return timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=IMAGE_PATCH, embed_dim=IMAGE_WIDTH, depth=depth, num_heads=3,
        in_chans=in_chans, num_classes=num_classes, global_pool="avg", class_token=False,
    )  # fmt: skip


IMAGE_LR = 3e-3  # likewise: the learning rate every square O(2) group picks on held-out digits
IMAGE_BATCH = 16


def image_models(num_classes: int, in_chans: int, depth: int) -> dict[str, Callable[[], torch.nn.Module]]:
    """label -> builder. O(2) ViTs at ~20k parameters (matched regular copies), Platonic and timm at width 48;
    every square model on 8^2 patches of the 32^2 image (16 tokens)."""
    import eqvit
    from eqvit.bench import o2_data_efficiency as o2

    def o2vit(grid: str, group: str, attention: str = "coupled") -> Callable[[], torch.nn.Module]:
        def make() -> torch.nn.Module:
            copies, _ = o2.matched_copies(grid, group, 20_000, depth, IMAGE_PATCH)
            common = dict(group=group, regular_copies=copies, depth=depth, num_heads=3, attention=attention)
            common.update(in_chans=in_chans, num_classes=num_classes)
            if grid == "square":
                return eqvit.create_model("o2vit_square_s", img_size=32, patch_size=IMAGE_PATCH, **common)
            side, pixels = o2.HEX_GRID
            # the images are resampled onto the hexagons once, in image_data
            return eqvit.create_model("o2vit_hex_s", img_size=None, n_patch_side=side, n_pixel_side=pixels, **common)

        return make

    def platonic(group: str) -> Callable[[], torch.nn.Module]:
        return lambda: platonic_image_model(group, in_chans, num_classes, depth)

    models = {f"O(2) square {g}": o2vit("square", g) for g in ("D4", "C4", "D2", "C1")}
    models["O(2) square D4 irrep-wise"] = o2vit("square", "D4", "irrepwise")
    models.update({f"O(2) hex {g}": o2vit("hex", g) for g in ("D6", "C6", "D3")})
    models.update({f"Platonic {g}": platonic(g) for g in ("C4", "D4")})
    models["timm ViT"] = lambda: timm_image_vit(in_chans, num_classes, depth)
    return models


def image_data(dataset: str, ratio: float, seed: int, hex_grid: bool, folder: Path | None) -> dict[str, tuple]:
    from eqvit.bench import o2_data_efficiency as o2
    from eqvit.data.images import rotated_mnist
    from eqvit.geometry import HexPatchGrid
    from eqvit.nn.tokenizers.hexagonal import SquareToHex

    if dataset == "rotated_mnist":
        data = rotated_mnist(ratio, seed=seed, img_size=32)
    else:
        data = image_folder_tensors(folder, ratio, seed)
    if hex_grid:
        to_hex = SquareToHex(32, HexPatchGrid(*o2.HEX_GRID).points)
        data = {k: (to_hex(x), y) for k, (x, y) in data.items()}
    return data


def image_folder_tensors(folder: Path, ratio: float, seed: int) -> dict[str, tuple]:
    """A PatternNet-style folder as 32x32 grey tensors (80/20 split per class), ``ratio`` of the training part."""
    from eqvit.data.images import ImageFolderDataset, image_folder_split

    train_items, val_items, _ = image_folder_split(folder, seed=seed)
    keep = max(1, int(round(ratio * len(train_items))))
    gen = torch.Generator().manual_seed(seed)
    train_items = [train_items[i] for i in torch.randperm(len(train_items), generator=gen)[:keep].tolist()]

    def stack(items: list) -> tuple[torch.Tensor, torch.Tensor]:
        ds = ImageFolderDataset(items, img_size=32)
        xs, ys = zip(*(ds[i] for i in range(len(ds))))
        return torch.stack(xs).mean(1, keepdim=True), torch.tensor(ys)

    return {"train": stack(train_items), "val": stack(val_items)}


def train_image_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """Train one (dataset, model, ratio, seed) cell; runs in a worker process with one thread."""
    from eqvit.train.classify import fit_classifier

    torch.set_num_threads(cell["threads"])
    folder = Path(cell["image_folder"]) if cell["image_folder"] else None
    hex_grid = " hex " in f" {cell['label']} "
    data = image_data(cell["dataset"], cell["ratio"], cell["seed"], hex_grid, folder)
    torch.manual_seed(cell["seed"])
    model = image_models(cell["num_classes"], 1, cell["depth"])[cell["label"]]()
    start = time.perf_counter()
    _, history = fit_classifier(
        model,
        data["train"],
        data["val"],
        epochs=cell["epochs"],
        batch_size=IMAGE_BATCH,
        lr=IMAGE_LR,
        patience=cell["patience"],
        seed=cell["seed"],
    )
    row = {k: cell[k] for k in ("dataset", "label", "ratio", "seed")} | {"accuracy": history.best_accuracy}
    row.update(params=sum(p.numel() for p in model.parameters()), epochs=history.epochs)
    row.update(best_epoch=history.best_epoch + 1, max_epochs=cell["epochs"], patience=cell["patience"])
    row.update(seconds=time.perf_counter() - start, train_size=len(data["train"][1]), lr=IMAGE_LR, batch=IMAGE_BATCH)
    return row


def image_schedule(ratio: float, quick: bool) -> tuple[int, int | None]:
    """``(max epochs, early-stopping patience)``: longer for less data, like the seed's App. F."""
    if quick:
        return 15, None
    return (100, 30) if ratio < 0.5 else (30, 8)


def run_images(args: argparse.Namespace, store: CellStore) -> dict[str, Any]:
    from eqvit.bench._pool import process_pool

    datasets = ["rotated_mnist"] + (["folder"] if args.image_folder else [])
    ratios = [0.1] if args.quick else [0.1, 1.0]
    seeds = args.seeds[:1] if args.quick else args.seeds
    depth = 2 if args.quick else 6
    cells = {}
    for dataset in datasets:
        num_classes = (
            10 if dataset == "rotated_mnist" else len({p.name for p in Path(args.image_folder).iterdir() if p.is_dir()})
        )
        for ratio in ratios:
            epochs, patience = image_schedule(ratio, args.quick)
            for seed in seeds:
                for label in image_models(num_classes, 1, depth):
                    key = f"{dataset}-{slug(label)}-r{ratio:g}-seed{seed}"
                    if not store.done(key):
                        cells[key] = dict(
                            dataset=dataset, label=label, ratio=ratio, seed=seed, num_classes=num_classes,
                            depth=depth, epochs=epochs, patience=patience, threads=args.threads,
                            image_folder=str(args.image_folder) if args.image_folder else None,
                        )  # fmt: skip
    # Small models train faster as separate one-thread processes than as one two-thread process.
    with process_pool(args.jobs) as pool:
        for key, row in zip(cells, pool.map(train_image_cell, cells.values())):
            store.put(key, row)
            print(
                f"{key}: accuracy {row['accuracy']:.3f} ({row['params']:,} params, {row['seconds']:.0f} s)", flush=True
            )
    rows = [c for k, c in store.cells.items() if k.split("-")[0] in datasets]
    return images_report(rows, store.folder, ratios, seeds, depth, args.quick)


def images_report(
    rows: list[dict], folder: Path, ratios: list[float], seeds: list[int], depth: int, quick: bool
) -> dict:
    groups: dict[tuple[str, str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["label"], r["ratio"]), []).append(r)
    summary = []
    for (dataset, label, ratio), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        mean, std = mean_std([r["accuracy"] for r in runs])
        summary.append(
            dict(
                dataset=dataset, label=label, ratio=ratio, params=runs[0]["params"], mean=mean, std=std, seeds=len(runs)
            )
        )
    lines = [
        f"Image classification (depth {depth}, seeds {seeds}, 8x8 patches, AdamW lr {IMAGE_LR:g}, batch "
        f"{IMAGE_BATCH}; max epochs / patience "
        + ", ".join(f"{image_schedule(r, quick)} at ratio {r:g}" for r in ratios)
        + "): best validation accuracy, mean ± std over seeds.",
        "",
        "| dataset | ratio | model | params | accuracy | seeds |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in summary:
        accuracy = f"{r['mean']:.3f} ± {r['std']:.3f}"
        lines.append(
            f"| {r['dataset']} | {r['ratio']:g} | {r['label']} | {r['params']:,} | {accuracy} | {r['seeds']} |"
        )
    plots = []
    plt = _pyplot()
    for dataset in sorted({r["dataset"] for r in summary}):
        fig, axes = plt.subplots(1, len(ratios), figsize=(6 * len(ratios), 4.2), squeeze=False)
        for ax, ratio in zip(axes[0], ratios):
            for r in (r for r in summary if r["dataset"] == dataset and r["ratio"] == ratio):
                ax.errorbar(math.log10(r["params"]), r["mean"], yerr=r["std"], fmt="o", capsize=3)
                ax.annotate(
                    r["label"],
                    (math.log10(r["params"]), r["mean"]),
                    fontsize=7,
                    xytext=(4, 2),
                    textcoords="offset points",
                )
            ax.set_xlabel("log10(parameters)")
            ax.set_ylabel("validation accuracy")
            ax.set_title(f"{dataset}, sample ratio {ratio:g}")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = folder / f"accuracy_vs_params_{dataset}.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        plots.append(path.name)
    return {"summary": summary, "table": "\n".join(lines), "plots": plots}


# ------------------------------------------------------------------------------------------------
# attention: the O(2) seed's Sec. 5.2 / Figure 5, coupled against irrep-wise attention for C4

# Table 1: V = 4q copies of C4's regular representation, four heads of 4q features in both layouts.
ATTENTION_LAYOUTS = {
    "coupled": {"attention": "coupled", "num_heads": 4},  # A^q + B^q + E1^q in every head
    "irrep-wise": {"attention": "irrepwise", "irrep_heads": {"A": 1, "B": 1, "E1": 2}},  # A^4q | B^4q | E1^2q x 2
}
# The seed's App. F for Sec. 5.2: sample ratio -> (max epochs, patience); MNIST runs the images schedule.
ATTENTION_SEED_SCHEDULE = {0.1: (600, 60), 1.0: (200, 30)}


def attention_schedule(dataset: str, ratio: float, quick: bool) -> tuple[int, int | None]:
    if quick:
        return (3, 1) if dataset == "folder" else image_schedule(ratio, quick)
    return ATTENTION_SEED_SCHEDULE[ratio] if dataset == "folder" else image_schedule(ratio, quick)


def train_attention_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """One (dataset, layout, q, ratio, seed) cell: rotated MNIST in memory, or the folder through the engine."""
    import eqvit
    from eqvit.bench import o2_data_efficiency as o2
    from eqvit.train.classify import fit_classifier

    torch.set_num_threads(cell["threads"])
    options = ATTENTION_LAYOUTS[cell["layout"]]
    copies = 4 * cell["q"]
    start = time.perf_counter()
    if cell["dataset"] == "folder":
        geometry = o2.Geometry(img_size=cell["img_size"], in_chans=3, num_classes=cell["num_classes"])
        spec = dict(
            grid="square", group="C4", depth=cell["depth"], patch_size=cell["patch_size"],
            image_folder=cell["image_folder"], ratio=cell["ratio"], batch_size=IMAGE_BATCH, seed=cell["seed"],
            lr=1e-3, epochs=cell["epochs"], patience=cell["patience"], threads=cell["threads"],
            device=cell["device"], out=cell["out"], model_options=options,
        )  # fmt: skip
        result = o2.train_folder_run(spec, geometry, copies)
        model = o2.build("square", "C4", copies, cell["depth"], cell["patch_size"], geometry, options)
        lr = 1e-3
    else:
        data = image_data("rotated_mnist", cell["ratio"], cell["seed"], False, None)
        torch.manual_seed(cell["seed"])
        model = eqvit.create_model(
            "o2vit_square_s", group="C4", img_size=32, patch_size=IMAGE_PATCH, in_chans=1, num_classes=10,
            regular_copies=copies, depth=cell["depth"], **options,
        )  # fmt: skip
        _, history = fit_classifier(
            model, data["train"], data["val"], epochs=cell["epochs"], batch_size=IMAGE_BATCH, lr=IMAGE_LR,
            patience=cell["patience"], seed=cell["seed"],
        )  # fmt: skip
        result = dict(
            accuracy=history.best_accuracy, best_epoch=history.best_epoch + 1, epochs_run=history.epochs,
            train_size=len(data["train"][1]), params=sum(p.numel() for p in model.parameters()),
        )  # fmt: skip
        lr = IMAGE_LR
    row = {k: cell[k] for k in ("dataset", "layout", "q", "ratio", "seed", "epochs", "patience")}
    row.update(result, head_dims=model.blocks[0].attn.head_dims, lr=lr, seconds=time.perf_counter() - start)
    row["loadavg"] = os.getloadavg()
    return row


def run_attention(args: argparse.Namespace, store: CellStore) -> dict[str, Any]:
    from eqvit.bench._pool import process_pool

    datasets = ["rotated_mnist"] + (["folder"] if args.image_folder else [])
    ratios = [0.1] if args.quick else [0.1, 1.0]
    qs = [1] if args.quick else args.qs
    seeds = args.seeds[:1] if args.quick else args.seeds
    depth = 2 if args.quick else 6
    cells = {}
    for dataset in datasets:
        num_classes = 10
        if dataset == "folder":
            num_classes = len([p for p in Path(args.image_folder).iterdir() if p.is_dir()])
        for ratio in ratios:
            epochs, patience = attention_schedule(dataset, ratio, args.quick)
            for q in qs:
                for seed in seeds:
                    for layout in ATTENTION_LAYOUTS:
                        key = f"{dataset}-{slug(layout)}-q{q}-r{ratio:g}-seed{seed}"
                        if not store.done(key):
                            cells[key] = dict(
                                dataset=dataset, layout=layout, q=q, ratio=ratio, seed=seed, depth=depth,
                                epochs=epochs, patience=patience, threads=args.threads, num_classes=num_classes,
                                image_folder=str(args.image_folder) if args.image_folder else None,
                                img_size=args.img_size, patch_size=args.patch_size, device=args.device,
                                out=str(store.folder / "runs" / key),
                            )  # fmt: skip
    with process_pool(args.jobs) as pool:
        for key, row in zip(cells, pool.map(train_attention_cell, cells.values())):
            store.put(key, row)
            print(
                f"{key}: accuracy {row['accuracy']:.3f} (heads {row['head_dims']}, {row['params']:,} params, "
                f"{row['seconds']:.0f} s, load {row['loadavg'][0]:.1f})",
                flush=True,
            )
    rows = [c for k, c in store.cells.items() if k.split("-")[0] in datasets and "layout" in c]
    return attention_report(rows, store.folder, args)


def attention_report(rows: list[dict], folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["ratio"], r["q"], r["layout"]), []).append(r)
    summary = []
    for (dataset, ratio, q, layout), runs in sorted(groups.items()):
        mean, std = mean_std([r["accuracy"] for r in runs])
        summary.append(
            dict(
                dataset=dataset, ratio=ratio, q=q, layout=layout, params=runs[0]["params"],
                head_dims=runs[0]["head_dims"], mean=mean, std=std, seeds=len(runs),
                epochs=(runs[0]["epochs"], runs[0]["patience"]),
            )
        )  # fmt: skip
    lines = [
        "Coupled vs irrep-wise attention, C4 with V = 4q regular copies and four heads of 4q features (the O(2) "
        "seed's Table 1 / Sec. 5.2): best validation accuracy, mean ± std over seeds. rotated_mnist is the "
        "shipped stand-in for PatternNet (32^2, 8^2 patches); folder runs at 256^2 / 16^2 by default.",
        "",
        "| dataset | ratio | q | attention | head dims | params | max epochs / patience | accuracy | seeds |",
        "|---|---:|---:|---|---|---:|---|---:|---:|",
    ]
    for r in summary:
        lines.append(
            f"| {r['dataset']} | {r['ratio']:g} | {r['q']} | {r['layout']} | {r['head_dims']} | {r['params']:,} | "
            f"{r['epochs'][0]} / {r['epochs'][1]} | {r['mean']:.3f} ± {r['std']:.3f} | {r['seeds']} |"
        )
    plt = _pyplot()
    plots = []
    for dataset in sorted({r["dataset"] for r in summary}):
        ratios = sorted({r["ratio"] for r in summary if r["dataset"] == dataset})
        fig, axes = plt.subplots(1, len(ratios), figsize=(5.5 * len(ratios), 4), squeeze=False)
        for ax, ratio in zip(axes[0], ratios):
            for layout in ATTENTION_LAYOUTS:
                sel = sorted(
                    (r for r in summary if (r["dataset"], r["ratio"], r["layout"]) == (dataset, ratio, layout)),
                    key=lambda r: r["params"],
                )
                ax.errorbar([math.log10(r["params"]) for r in sel], [r["mean"] for r in sel],
                            yerr=[r["std"] for r in sel], fmt="o-", capsize=3, label=layout)  # fmt: skip
            ax.set_title(f"{dataset}, sample ratio {ratio:g}")
            ax.set_xlabel("log10(parameters)")
            ax.set_ylabel("validation accuracy")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        path = folder / f"attention_{dataset}.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        plots.append(path.name)
    return {"summary": summary, "table": "\n".join(lines), "plots": plots}


# ------------------------------------------------------------------------------------------------
# driver

TASKS: dict[str, Callable[[argparse.Namespace, CellStore], dict[str, Any]]] = {
    "swe": run_swe,
    "points": run_points,
    "images": run_images,
    "attention": run_attention,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--quick", action="store_true", help="CI-sized runs (each task under 15 min on 2 cores)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--minutes", type=float, default=None, help="swe: training minutes per model")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--image-folder", type=Path, default=None, help="images, attention: also a PatternNet-style folder"
    )
    parser.add_argument("--qs", type=int, nargs="+", default=[1, 2, 3], help="attention: V = 4q regular copies")
    parser.add_argument("--img-size", type=int, default=256, help="attention --image-folder: square side")
    parser.add_argument("--patch-size", type=int, default=16, help="attention --image-folder: patch side")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (training; per job for images)")
    parser.add_argument("--jobs", type=int, default=2, help="images: cells trained at once, in worker processes")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true", help="swe speed: bf16 autocast (GPU)")
    parser.add_argument("--fresh", action="store_true", help="ignore finished cells and start over")
    parser.add_argument("--rollout", type=int, default=None, help="swe: autoregressive rollout steps (16, quick 4)")
    args = parser.parse_args(argv)
    if args.rollout is None:
        args.rollout = 4 if args.quick else 16

    torch.set_num_threads(args.threads)
    folder = args.out / (f"{args.task}_quick" if args.quick else args.task)
    if args.fresh and folder.exists():
        for path in (folder / "cells").glob("*.json"):
            path.unlink()
        for path in (folder / "runs").glob("*/last.*"):  # swe checkpoints that a resumed run would load
            path.unlink()
    store = CellStore(folder)
    if store.cells:
        print(f"resuming: {len(store.cells)} finished cells in {folder / 'cells'}", flush=True)
    cells_before = set(store.cells)
    started = time.perf_counter()
    report = TASKS[args.task](args, store)
    this_run = dict(
        machine=machine(),
        wall_minutes=(time.perf_counter() - started) / 60,
        cells_added=sorted(set(store.cells) - cells_before),
    )
    report.update(task=args.task, quick=args.quick, invocations=past_invocations(folder) + [this_run])
    (folder / "results.json").write_text(json.dumps({k: v for k, v in report.items() if k != "table"}, indent=2))
    (folder / "results.md").write_text(report["table"] + "\n")
    print(report["table"])
    print(f"\nwrote {folder / 'results.json'}, {folder / 'results.md'} and {', '.join(report['plots'])}")


if __name__ == "__main__":
    main()
