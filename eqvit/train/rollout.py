"""Autoregressive rollouts on shallow water: the model fed its own predictions, scored against the solver.

From each validation initial condition the model predicts step 1, then step 2 from its step-1
prediction, and so on; the truth is the solver integrated from the same initial condition
(:meth:`ShallowWaterData.step`, exact spectral states, synthesised on the model's domain).
Persistence (predicting the initial state at every lead time) is the reference. Per step the
metrics are those of the one-step evaluation (:meth:`ShallowWaterTask.evaluate`): quadrature-weighted
relative L1 and L2 and the seed's L1 and L2 (mean over channels and initial conditions) and the polar
error ratio of the mean absolute error map (:func:`~eqvit.train.metrics.polar_error_ratio`).

A model whose prediction stops being finite does not crash the rollout: the first non-finite
step is recorded, the model's metrics from that step on are ``None``, persistence goes on.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from eqvit.utils import check_memory, format_bytes

__all__ = [
    "load_maps",
    "plot_rollout",
    "plot_rollout_comparison",
    "rollout",
    "rollout_checkpoint",
    "rollout_json",
    "rollout_table",
    "save_maps",
]

TABLE_LEADS = (1, 2, 4, 8, 12, 16, 24)
MAX_STEPS = 10_000  # a rollout keeps two error maps a step; beyond this it would run for days


def map_steps(num_steps: int) -> list[int]:
    """Lead times drawn as maps: 1, 4, 16, ... up to ``num_steps`` and ``num_steps`` itself (at most 4)."""
    steps = [k for k in (1, 4, 16, 64) if k < num_steps] + [num_steps]
    return sorted(set(steps))[-4:] if num_steps > 1 else [1]


@torch.no_grad()
def rollout(model: nn.Module, task: Any, num_steps: int, progress: bool = False) -> dict[str, Any]:
    """Roll ``model`` out for ``num_steps`` from the validation initial conditions of ``task``.

    Args:
        model: maps a normalised state ``[B, 3, V]`` (or ``[B, 3, nlat, nlon]``) to the next one.
        task: a :class:`~eqvit.train.tasks.ShallowWaterTask` (its validation set, solver, domain, weights).
        num_steps: N >= 1 steps of ``task.cfg.dt_hours`` each.

    Returns ``{"steps": [per-step metrics], "first_nonfinite_step": int | None, "maps": {step: (model
    map or None, persistence map)}, ...}``; :func:`rollout_json` is its JSON form.
    """
    from eqvit.train.metrics import SphereErrorMap, polar_error_ratio
    from eqvit.train.tasks import ERROR_METRICS, sample_errors

    if not hasattr(task, "validation") or not hasattr(getattr(task, "data", None), "step"):
        raise ValueError(
            f"expected a shallow-water task (data.name: shallow_water) for a rollout, got {type(task).__name__}"
        )
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or not 1 <= num_steps <= MAX_STEPS:
        raise ValueError(
            f"expected num_steps to be an integer in [1, {MAX_STEPS}] ({MAX_STEPS * task.cfg.dt_hours / 24:.0f} days "
            f"of {task.cfg.dt_hours:g}-hour steps), got {num_steps!r}"
        )
    val, data, kind = task.validation, task.data, task.kind
    x_all = val.x_grid if kind == "grid" else val.x_points
    per_step = 2 * (8 * math.prod(x_all.shape[2:]) + 1024) + 16 * 8  # two error maps and the metric sums
    check_memory(
        f"a rollout of {num_steps:,} steps", num_steps * per_step, f"{num_steps:,} x {format_bytes(per_step)} a step"
    )
    was_training = model.training
    model.eval()
    n, bs = len(val.spec_x), task.cfg.val_batch_size
    sums = {f"{who}{key}": np.zeros(num_steps) for who in ("", "persistence_") for key in ERROR_METRICS}
    maps = [SphereErrorMap(kind="abs") for _ in range(num_steps)]
    p_maps = [SphereErrorMap(kind="abs") for _ in range(num_steps)]
    first_bad: int | None = None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=math.ceil(n / bs) * num_steps, desc="rollout", unit="step", leave=False)
    for start in range(0, n, bs):
        spec = val.spec_x[start : start + bs]
        x0 = x_all[start : start + bs].to(task.device)
        state: torch.Tensor | None = x0
        for k in range(num_steps):
            spec = data.step(spec)
            truth = data.fields(spec, kind).double()
            if state is not None:
                state = model(state)
                if not bool(torch.isfinite(state).all()):
                    first_bad = k + 1 if first_bad is None else min(first_bad, k + 1)
                    state = None  # this batch stops here; its later steps cannot be scored
            if state is not None:
                pred = state.double().cpu()
                for key, err in sample_errors(pred, truth, task.weights).items():
                    sums[key][k] += err.mean(1).sum().item()
                maps[k].update(pred, truth)
            persistence = x0.double().cpu()
            for key, err in sample_errors(persistence, truth, task.weights).items():
                sums[f"persistence_{key}"][k] += err.mean(1).sum().item()
            p_maps[k].update(persistence, truth)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    if was_training:
        model.train()
    where = task.latitudes if task.on_grid else task.points
    steps = []
    for k in range(num_steps):
        ok = first_bad is None or k + 1 < first_bad
        p_map = p_maps[k].compute()
        steps.append(
            {
                "step": k + 1,
                "lead_hours": (k + 1) * float(task.cfg.dt_hours),
                **{key: float(sums[key][k] / n) if ok else None for key in ERROR_METRICS},
                **{f"persistence_{key}": float(sums[f"persistence_{key}"][k] / n) for key in ERROR_METRICS},
                "polar_error_ratio": float(polar_error_ratio(maps[k].compute(), where, task.weights)) if ok else None,
                "persistence_polar_error_ratio": float(polar_error_ratio(p_map, where, task.weights)),
            }
        )
    drawn = {
        k: (maps[k - 1].compute() if first_bad is None or k < first_bad else None, p_maps[k - 1].compute())
        for k in map_steps(num_steps)
    }
    return {
        "num_steps": num_steps,
        "dt_hours": float(task.cfg.dt_hours),
        "num_initial_conditions": n,
        "first_nonfinite_step": first_bad,
        "steps": steps,
        "maps": drawn,
    }


def rollout_json(result: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The JSON-serialisable part of a :func:`rollout` result (no maps), with ``extra`` fields first."""
    return {**extra, **{k: v for k, v in result.items() if k != "maps"}}


def rollout_table(result: dict[str, Any], leads: tuple[int, ...] = TABLE_LEADS) -> str:
    """Text table at the lead times ``leads`` that were rolled out (model and persistence)."""

    def fmt(v: float | None) -> str:
        return f"{v:>9.4f}" if v is not None else f"{'non-fin.':>9}"

    columns = {"rel_l2": "rel L2", "rel_l1": "rel L1", "l2": "L2"}
    header = " ".join(f"{label:>9} {'persist.':>9}" for label in columns.values())
    lines = [f"{'step':>5} {'lead [h]':>8} {header} {'polar':>7}"]
    for s in result["steps"]:
        if s["step"] in leads or s["step"] == result["num_steps"]:
            polar = f"{s['polar_error_ratio']:>7.3f}" if s["polar_error_ratio"] is not None else f"{'-':>7}"
            values = " ".join(f"{fmt(s.get(key))} {fmt(s.get(f'persistence_{key}'))}" for key in columns)
            lines.append(f"{s['step']:>5} {s['lead_hours']:>8g} {values} {polar}")
    if result["first_nonfinite_step"] is not None:
        lines.append(f"the model's prediction is not finite from step {result['first_nonfinite_step']} on")
    return "\n".join(lines)


def _curves(ax, results: dict[str, dict[str, Any]], key: str, persistence_from: str) -> None:
    for label, result in results.items():
        leads = [s["lead_hours"] for s in result["steps"]]
        values = [np.nan if s[key] is None else s[key] for s in result["steps"]]
        ax.plot(leads, values, marker="o", ms=3, label=label)
        if result["first_nonfinite_step"] is not None:
            ax.axvline(result["first_nonfinite_step"] * result["dt_hours"], color="r", lw=0.8, ls=":")
    ref = results[persistence_from]
    ax.plot(
        [s["lead_hours"] for s in ref["steps"]],
        [s[f"persistence_{key}"] for s in ref["steps"]],
        color="k",
        ls="--",
        label="persistence",
    )
    ax.set_xlabel("lead time [h]")
    ax.set_ylabel(f"relative {key[-2:].upper()} (mean over initial conditions)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)


def _array(m: Any) -> np.ndarray | None:
    return None if m is None else np.asarray(m.numpy() if isinstance(m, torch.Tensor) else m, dtype=np.float64)


def save_maps(result: dict[str, Any], path: str | Path) -> None:
    """The rollout's maps as ``.npz`` (``model_<step>``, ``persistence_<step>``), for redrawing later."""
    arrays = {}
    for k, (m, p) in result["maps"].items():
        if m is not None:
            arrays[f"model_{k}"] = _array(m).astype(np.float32)
        arrays[f"persistence_{k}"] = _array(p).astype(np.float32)
    np.savez_compressed(path, **arrays)


def load_maps(path: str | Path) -> dict[int, tuple[np.ndarray | None, np.ndarray]]:
    """Inverse of :func:`save_maps`; a file that is not one is a ValueError naming it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            steps = sorted(int(name.split("_")[1]) for name in data.files if name.startswith("persistence_"))
            return {
                k: (data[f"model_{k}"] if f"model_{k}" in data.files else None, data[f"persistence_{k}"]) for k in steps
            }
    except (OSError, ValueError, IndexError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"{path} is not a file of rollout error maps (save_maps): {type(err).__name__}: {err}"
        ) from None


def plot_rollout_comparison(results: dict[str, dict[str, Any]], path: str | Path, title: str = "") -> None:
    """Error against lead time for every model (and persistence) and, per model, the error maps at
    the drawn lead times (``result["maps"]``: ``{step: (model map or None, persistence map)}``, numpy or
    torch): one figure, one colour scale for every map, each map on its model's own grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    from eqvit.train.metrics import draw_sphere_map, map_keywords

    first = next(iter(results))
    leads = list(next(iter(results.values()))["maps"])
    panels = []  # (row label, lead, map)
    for label, result in results.items():
        for k in leads:
            panels.append((label, k, _array(result["maps"][k][0])))
    panels += [("persistence", k, _array(results[first]["maps"][k][1])) for k in leads]
    finite = [m for _, _, m in panels if m is not None]
    vmax = max(float(np.nanpercentile(m, 99)) for m in finite) if finite else 1.0
    norm = Normalize(0.0, vmax if np.isfinite(vmax) and vmax > 0 else 1.0)
    cols, map_rows = len(leads), len(results) + 1
    fig = plt.figure(figsize=(max(9.0, 3.6 * cols), 3.4 + 2.1 * map_rows), layout="constrained")
    grid = fig.add_gridspec(1 + map_rows, cols, height_ratios=[1.6] + [1.0] * map_rows)
    top = grid[0, :].subgridspec(1, 2)
    for i, key in enumerate(("rel_l2", "rel_l1")):
        ax = fig.add_subplot(top[0, i])
        _curves(ax, results, key, first)
        if i == 0:
            ax.legend(fontsize=7)
    artist = None
    axes = []
    for index, (label, k, emap) in enumerate(panels):
        ax = fig.add_subplot(grid[1 + index // cols, index % cols])
        axes.append(ax)
        if emap is None:
            ax.axis("off")
            ax.text(0.5, 0.5, f"{label}\nnot finite at {k} h", ha="center", va="center", transform=ax.transAxes)
            continue
        artist = draw_sphere_map(ax, emap, norm=norm, **map_keywords(emap))
        ax.set_title(f"{label}, lead {k * results[first]['dt_hours']:g} h", fontsize=8)
    if artist is not None:
        fig.colorbar(artist, ax=axes, label="mean |error| (normalised units)", shrink=0.8, extend="max")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rollout(result: dict[str, Any], path: str | Path, name: str) -> None:
    """``rollout.png`` of one model: error against lead time with persistence, and its error maps."""
    plot_rollout_comparison(
        {name: result},
        path,
        title=f"{name}: autoregressive rollout from {result['num_initial_conditions']} validation initial conditions",
    )


def rollout_checkpoint(config: Any, checkpoint: str | Path, num_steps: int, out: str | Path) -> dict[str, Any]:
    """``eqvit eval CONFIG --checkpoint CK --rollout N --out DIR``: write ``DIR/rollout.json`` and
    ``DIR/rollout.png``, print the table; returns the JSON dict."""
    from eqvit.train.checkpoint import prepare_output_dir
    from eqvit.train.engine import load_for_evaluation

    if config.data.name != "shallow_water":
        raise ValueError(f"expected a shallow_water config for --rollout, got data.name {config.data.name!r}")
    folder = prepare_output_dir(out)
    model, task = load_for_evaluation(config, checkpoint)
    load_start = os.getloadavg()
    result = rollout(model, task, num_steps, progress=True)
    report = rollout_json(
        result,
        model=config.model.name,
        checkpoint=str(checkpoint),
        # the machine's state beside the figures, as every benchmark result records it
        loadavg_start=[round(v, 2) for v in load_start],
        loadavg_end=[round(v, 2) for v in os.getloadavg()],
        torch=torch.__version__,
        threads=torch.get_num_threads(),
    )
    (folder / "rollout.json").write_text(json.dumps(report, indent=2))
    plot_rollout(result, folder / "rollout.png", config.model.name)
    print(rollout_table(result))
    print(f"wrote {folder / 'rollout.json'} and {folder / 'rollout.png'}")
    return report
