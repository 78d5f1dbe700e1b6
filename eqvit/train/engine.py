"""A compact training engine: Adam, cosine/plateau schedule, clipping, seeds, tqdm, plots.

``train(config)`` builds the registered model and the task, trains until ``max_steps`` or
``max_minutes`` (whichever comes first: equal wall-clock comparisons use the latter), evaluates
against persistence, and writes into ``OUT``: ``last.safetensors`` + ``last.json``,
``metrics.json``, ``history.csv``, ``loss_curve.png`` and ``error_map.png``.
"""

from __future__ import annotations

import csv
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from eqvit.models import create_model
from eqvit.train.checkpoint import load_checkpoint, load_model_state, save_checkpoint
from eqvit.train.config import ExperimentConfig, ScheduleConfig
from eqvit.train.tasks import build_task


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def learning_rate(base_lr: float, cfg: ScheduleConfig, progress: float, step: int) -> float:
    """LR at ``progress`` in [0, 1] of the run (warm-up by steps, then cosine or constant)."""
    if step < cfg.warmup_steps:
        return base_lr * (step + 1) / cfg.warmup_steps
    if cfg.name == "cosine":
        return cfg.min_lr + 0.5 * (base_lr - cfg.min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))
    return base_lr  # "constant", and "plateau" (lowered by ReduceLROnPlateau at evaluations)


@dataclass
class History:
    """What a run records: training loss per logged step, and evaluations."""

    train: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not torch.is_tensor(v)}


def _plot_history(history: History, persistence_l2: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    steps = [h["step"] for h in history.train]
    ax1.plot(steps, [h["loss"] for h in history.train], lw=1)
    ax1.set_yscale("log")
    ax1.set_xlabel("step")
    ax1.set_ylabel("train loss (weighted MSE)")
    ax2.plot([h["step"] for h in history.evals], [h["rel_l2"] for h in history.evals], "o-", label="model")
    ax2.axhline(persistence_l2, color="gray", ls="--", label="persistence")
    ax2.set_xlabel("step")
    ax2.set_ylabel("validation relative L2")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _summary_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    lines = [f"{'':<14} {'rel L2':>9} {'rel L1':>9} {'polar ratio':>12}"]
    for name, m in rows:
        lines.append(f"{name:<14} {m['rel_l2']:>9.4f} {m['rel_l1']:>9.4f} {m['polar_error_ratio']:>12.3f}")
    return "\n".join(lines)


def train(
    config: ExperimentConfig,
    out_dir: str | Path | None = None,
    max_steps: int | None = None,
    max_minutes: float | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train ``config``; returns the final metrics (model and persistence)."""
    tcfg = config.train
    max_steps = max_steps if max_steps is not None else tcfg.max_steps
    max_minutes = max_minutes if max_minutes is not None else tcfg.max_minutes
    out = Path(out_dir or tcfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    seed_everything(tcfg.seed)
    device = torch.device(tcfg.device)

    model = create_model(config.model.name, **config.model.kwargs).to(device)
    task = build_task(config.data, model, device)
    ocfg = config.optim
    optimizer = torch.optim.Adam(model.parameters(), lr=ocfg.lr, weight_decay=ocfg.weight_decay)
    plateau = (
        torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, factor=config.schedule.factor, patience=config.schedule.patience
        )
        if config.schedule.name == "plateau"
        else None
    )
    persistence = task.evaluate(None)
    history = History()
    num_params = sum(p.numel() for p in model.parameters())
    bar = tqdm(total=max_steps, desc=config.model.name, disable=not progress, dynamic_ncols=True)
    start = time.perf_counter()
    step, running = 0, None
    model.train()
    while step < max_steps:
        elapsed = time.perf_counter() - start
        if max_minutes is not None and elapsed >= 60 * max_minutes:
            break
        frac = step / max_steps if max_minutes is None else max(step / max_steps, elapsed / (60 * max_minutes))
        if plateau is None:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(ocfg.lr, config.schedule, frac, step)
        x, y = task.train_batch()
        loss = task.loss(model(x), y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step}; stopping (last checkpoint kept)")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if ocfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), ocfg.grad_clip)
        optimizer.step()
        step += 1
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        history.train.append({"step": step, "time_s": time.perf_counter() - start, "loss": loss.item()})
        bar.update(1)
        if step % tcfg.log_every == 0:
            bar.set_postfix(loss=f"{running:.4f}", lr=f"{optimizer.param_groups[0]['lr']:.1e}")
        if tcfg.eval_every and step % tcfg.eval_every == 0:
            metrics = task.evaluate(model)
            history.evals.append(
                {"step": step, **{k: v for k, v in _scalars(metrics).items() if not isinstance(v, list)}}
            )
            if plateau is not None:
                plateau.step(metrics["rel_l2"])
    bar.close()
    train_seconds = time.perf_counter() - start
    final = task.evaluate(model)
    if not history.evals or history.evals[-1]["step"] != step:
        history.evals.append({"step": step, **{k: v for k, v in _scalars(final).items() if not isinstance(v, list)}})

    summary = {
        "model": config.model.name,
        "params": num_params,
        "steps": step,
        "train_seconds": train_seconds,
        "seconds_per_step": train_seconds / max(step, 1),
        "metrics": _scalars(final),
        "persistence": _scalars(persistence),
        "beats_persistence_l2": final["rel_l2"] < persistence["rel_l2"],
    }
    save_checkpoint(out, model, step=step, config=config.to_dict(), metrics=summary["metrics"], optimizer=optimizer)
    (out / "metrics.json").write_text(json.dumps(summary, indent=2))
    with open(out / "history.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["step", "time_s", "loss"])
        writer.writeheader()
        writer.writerows(history.train)
    (out / "evals.json").write_text(json.dumps(history.evals, indent=2))
    _plot_history(history, persistence["rel_l2"], out / "loss_curve.png", config.model.name)
    task.plot_error_map(final["error_map"], out / "error_map.png", f"{config.model.name}: mean |error| over validation")
    if progress:
        print(f"\n{config.model.name}: {num_params / 1e6:.2f}M params, {step} steps in {train_seconds:.0f} s")
        print(_summary_table([(config.model.name, final), ("persistence", persistence)]))
        print(f"wrote {out}/last.safetensors, metrics.json, loss_curve.png, error_map.png")
    return summary


def evaluate_checkpoint(config: ExperimentConfig, checkpoint: str | Path, progress: bool = True) -> dict[str, Any]:
    """Score a saved checkpoint of ``config``'s model on the validation set."""
    tensors, _ = load_checkpoint(checkpoint)
    device = torch.device(config.train.device)
    model = create_model(config.model.name, **config.model.kwargs).to(device)
    load_model_state(model, tensors, str(checkpoint))
    task = build_task(config.data, model, device)
    final, persistence = task.evaluate(model), task.evaluate(None)
    if progress:
        print(_summary_table([(config.model.name, final), ("persistence", persistence)]))
    return {"metrics": _scalars(final), "persistence": _scalars(persistence)}
