"""The training engine every model family uses.

``train(config)`` builds the registered model and the task (``data.name``: shallow water, or a
classification dataset, see :mod:`eqvit.train.tasks`), trains until ``max_steps`` (or
``max_epochs``) or ``max_minutes`` (whichever comes first; equal wall-clock comparisons use the
latter), evaluates against the task's baseline (persistence; the majority class), and writes into
``OUT``: ``last.safetensors`` + ``last.json`` (checkpoint), ``best.safetensors`` + ``best.json`` (the model
at the best evaluation of ``train.monitor``; early stopping after ``train.patience`` evaluations
without a better one), ``metrics.json`` (with ``best_step`` and ``stopped_early``), ``history.csv``,
``evals.json``, ``loss_curve.png`` and the task's plots (``error_map.png``; ``confusion.png``).

The same ``Trainer`` trains a model object on any :class:`~eqvit.train.tasks.Task` (``Trainer(config,
model=..., task=..., callbacks=..., write=False)``): :func:`eqvit.train.classify.fit_classifier` is that,
with :class:`~eqvit.train.tasks.TensorClassificationTask` and the :class:`EarlyStopping` callback.
Callbacks (:class:`Callback`) see the run at fixed points (start, each step, each evaluation, each
restriction, the end of training, the final summary) and may stop it; the reports (``metrics.json``,
the curves, the task's plots) are one such callback, :class:`ReportWriter`.

``model.relaxation`` breaks symmetry gradually: at the scheduled steps / epochs the O(2)-subgroup
ViT is replaced by its restriction to a subgroup (the same function; the optimiser restarts), and
checkpoints record the restrictions so that resuming and ``evaluate_checkpoint`` rebuild them.

Resuming (``resume=True``) restores the model, optimiser, LR-schedule, RNG and data-stream
states, so a run interrupted at any moment and resumed reproduces the uninterrupted loss curve
(on CPU, same threads). Under ``torchrun`` the model is wrapped in DistributedDataParallel
(gloo on CPU, nccl on GPU); every rank draws the same global batch and trains on its slice, so
the same global batch gives the same loss as one process; only rank 0 writes and prints.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from eqvit.models import create_model
from eqvit.train.budget import build_within_memory, check_training_memory
from eqvit.train.checkpoint import (
    CheckpointError,
    OutputDirError,
    RunLock,
    check_model_config,
    check_out_path,
    check_resume_state,
    clean_stale_temporaries,
    load_checkpoint,
    load_model_state,
    normalise_model_config,
    prepare_output_dir,
    restore_optimizer_state,
    save_checkpoint,
)
from eqvit.train.config import ConfigError, ExperimentConfig, RelaxationConfig, ScheduleConfig
from eqvit.train.multistep import check_multistep, rollout_events, rollout_steps_at, unrolled_loss
from eqvit.train.signals import Interrupted, shielded, stop_signals
from eqvit.train.tasks import Task, build_task, check_dataset_name
from eqvit.utils import MemoryBudgetError

Inputs = torch.Tensor | tuple[torch.Tensor, ...]


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
    """What a run records: training loss per step, and evaluations."""

    train: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Distributed:
    """This process's place in a torchrun job (world size 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: torch.device) -> Distributed:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls()
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not torch.is_tensor(v)}


def _eval_row(step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    return {"step": step, **{k: v for k, v in _scalars(metrics).items() if not isinstance(v, list)}}


def _plot_history(
    history: History,
    task: Any,
    baseline: dict[str, Any],
    path: Path,
    title: str,
    events: list[tuple[int, str]] = (),
) -> None:
    """Training loss per step and the task's monitored validation metric per evaluation.

    ``events``: ``(step, label)`` marked by vertical lines (the restrictions of ``model.relaxation``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = task.monitor
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot([h["step"] for h in history.train], [h["loss"] for h in history.train], lw=1)
    if task.loss_log_scale:
        ax1.set_yscale("log")
    ax1.set_xlabel("step")
    ax1.set_ylabel(task.loss_label)
    ax2.plot([h["step"] for h in history.evals], [h[metric] for h in history.evals], "o-", label="model")
    ax2.axhline(baseline[metric], color="gray", ls="--", label=task.baseline_name.replace("_", " "))
    ax2.set_xlim(left=0)
    ax2.set_xlabel("step")
    ax2.set_ylabel(task.curve_label)
    for step, label in events:
        for ax in (ax1, ax2):
            ax.axvline(step, color="tab:red", lw=0.8, ls=":")
        ax2.annotate(f"-> {label}", (step, 1), xycoords=("data", "axes fraction"), fontsize=8, va="top")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _call(network: nn.Module, x: Inputs) -> torch.Tensor:
    return network(*x) if isinstance(x, tuple) else network(x)


def relaxation_steps(config: ExperimentConfig, steps_per_epoch: int | None) -> list[tuple[int, str]]:
    """``model.relaxation.schedule`` as sorted ``(step, subgroup)`` pairs (epochs converted to steps)."""
    rcfg = config.model.relaxation
    if not rcfg.schedule:
        return []
    scale = 1
    if rcfg.unit == "epoch":
        if steps_per_epoch is None:
            raise ValueError(
                f"model.relaxation.unit 'epoch' needs a dataset with epochs; data.name {config.data.name!r} "
                "streams fresh samples (use unit: step)"
            )
        scale = steps_per_epoch
    return sorted((int(k) * scale, name) for k, name in rcfg.schedule.items())


def check_relaxation(model: nn.Module, schedule: dict[int, str]) -> None:
    """A clear error now, not at step k, for a ``{time: subgroup}`` schedule that is not a chain of subgroups."""
    if not schedule:
        return
    from eqvit.models.restrict import find_subgroup
    from eqvit.models.restrict_irreps import is_irrep_model
    from eqvit.models.restrict_platonic import is_platonic

    platonic = is_platonic(model)
    if not platonic and not is_irrep_model(model):  # the two families restrict() dispatches on
        raise ValueError(
            f"model.relaxation needs an O(2)-subgroup ViT (o2vit_*) or a Platonic Transformer (platonic_*), "
            f"got {type(model).__name__} {getattr(model, 'default_cfg', {}).get('architecture', '')}".rstrip()
        )
    group = model.frames if platonic else model.group  # Platonic models restrict their frames
    for _, name in sorted(schedule.items()):
        try:
            group = find_subgroup(group, name)
        except ValueError as err:
            raise ValueError(f"model.relaxation.schedule: {err}") from None


def build_model(config: ExperimentConfig) -> nn.Module:
    """The registered model ``model.name`` with ``model.kwargs``; a bad name, key or value is a ConfigError, a model
    that would not fit in the machine's memory a MemoryBudgetError (:func:`~eqvit.train.budget.build_within_memory`)."""
    name, kwargs = config.model.name, config.model.kwargs
    try:
        return build_within_memory(functools.partial(create_model, name), name, kwargs)
    except MemoryBudgetError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"cannot build model {name!r} from model.kwargs {kwargs}: {err}") from None


RUN_FILES = ("last.safetensors", "last.json", "best.safetensors", "best.json")


def check_no_previous_run(out: str | Path) -> None:
    """OutputDirError when ``out`` already holds a run's checkpoint, its last or its best one (``train``
    without resume / overwrite)."""
    out = Path(out)
    previous = [name for name in RUN_FILES if (out / name).exists()]
    if not previous:
        return
    if not (out / "last.safetensors").exists():
        raise OutputDirError(
            f"{out} already holds a run's best model ({', '.join(previous)}) but no last checkpoint to resume from; "
            "pass --overwrite to replace it with a new run, or choose another --out"
        )
    raise OutputDirError(
        f"{out} already holds a run ({', '.join(previous)}); pass --resume to continue it, --overwrite to "
        "replace its checkpoints with a new run, or choose another --out"
    )


def check_resumable(out: str | Path) -> None:
    """OutputDirError for ``--resume`` into a folder with a best model but no last checkpoint (the best one
    keeps no optimiser or data state, and a fresh start would replace it)."""
    out = Path(out)
    if not (out / "last.safetensors").exists() and (out / "best.safetensors").exists():
        raise OutputDirError(
            f"{out} holds a best model (best.safetensors) but no last.safetensors to resume from; pass --overwrite "
            "to replace it with a new run, or choose another --out"
        )


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    for path in (folder, *folder.absolute().parents):
        if path.exists() or path.is_symlink():
            break
        missing.append(path)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the ``folders`` (deepest first) that are empty; stop at the first that is not."""
    for path in folders:
        try:
            path.rmdir()
        except OSError:
            return


def restrict_model(model: nn.Module, subgroup: str) -> nn.Module:
    """:func:`eqvit.models.restrict.restrict` (O(2)-subgroup ViTs and Platonic Transformers alike) on the
    model's device, leaving the global RNG alone."""
    from eqvit.models.restrict import restrict

    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[]):
        return restrict(model, subgroup).to(device)


class Callback:
    """Hooks into a :class:`Trainer` run; every method is optional (the defaults do nothing).

    A callback may set ``trainer.should_stop = True`` (training ends after the current step) and may
    change the model's weights in ``on_train_end`` (then it sets ``trainer.last_eval = None`` so that
    the final evaluation is recomputed).
    """

    def on_start(self, trainer: Trainer) -> None:
        """After the baseline is scored, before the first step."""

    def on_step(self, trainer: Trainer, loss: float) -> None:
        """After each optimiser step (``trainer.step`` counts it; ``trainer.last_batch_size`` samples)."""

    def on_evaluate(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        """After each validation (the periodic ones and the one after the last step)."""

    def on_relax(self, trainer: Trainer, subgroup: str) -> None:
        """After the model was replaced by its restriction to ``subgroup`` (a fresh optimiser too)."""

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last step and its evaluation, before the final evaluation and the reports."""

    def on_finish(self, trainer: Trainer, summary: dict[str, Any], final: dict[str, Any]) -> None:
        """With the run's summary and the full final evaluation (rank 0 and all others)."""

    def summary(self, trainer: Trainer) -> dict[str, Any]:
        """Entries for the run's summary (``metrics.json``), added before the reports are written."""
        return {}


def monitor_mode(metric: str, task: Any) -> str:
    """``"max"`` or ``"min"``: the task's own ``monitor_mode`` for its monitored metric; otherwise a metric
    whose name holds ``acc`` (accuracy) is maximised and every other one (losses, errors) minimised."""
    if metric == task.monitor:
        return task.monitor_mode
    return "max" if "acc" in metric else "min"


class EarlyStopping(Callback):
    """Keep the best model by a validation metric; stop after ``patience`` units without a better one.

    Args:
        patience: epochs / steps / evaluations (``unit``) after the best before the run stops;
            ``None`` never stops early (the best is still kept).
        unit: ``"epoch"`` (tasks with epochs), ``"step"`` or ``"evaluation"`` (what ``train.patience``
            counts).
        monitor: the metric (a key of the task's evaluation, e.g. ``accuracy``, ``val_loss``,
            ``rel_l2``); ``None``: the task's ``monitor``. ``mode``: ``"max"`` / ``"min"``, default
            :func:`monitor_mode`.
        restore_best: load the best weights back into the model at the end of training
            (:func:`~eqvit.train.classify.fit_classifier`); ``False`` leaves the last weights (the config's
            runs, whose ``last`` checkpoint must resume).
        save_best: write ``OUT/best.safetensors`` + ``best.json`` at every new best (runs that write).

    A restriction (``model.relaxation``) forgets the best so far: its weights belong to another
    architecture. On a resumed run the best and the count since it are rebuilt from the restored
    evaluation history. The run's summary (``metrics.json``) gets ``stopped_early``, ``best_step``,
    ``monitor`` and ``patience``.
    """

    UNITS = ("epoch", "step", "evaluation")

    def __init__(
        self,
        patience: int | None = None,
        unit: str = "epoch",
        *,
        monitor: str | None = None,
        mode: str | None = None,
        restore_best: bool = True,
        save_best: bool = False,
    ) -> None:
        if patience is not None and patience < 0:
            raise ValueError(f"expected patience >= 0 or None, got {patience}")
        if unit not in self.UNITS:
            raise ValueError(f"expected unit one of {', '.join(map(repr, self.UNITS))}, got {unit!r}")
        if mode not in (None, "max", "min"):
            raise ValueError(f"expected mode 'max', 'min' or None, got {mode!r}")
        self.patience, self.unit = patience, unit
        self.monitor, self.mode = monitor, mode
        self.restore_best, self.save_best = restore_best, save_best
        self.best: float | None = None
        self.best_step = -1
        self.best_state: dict[str, torch.Tensor] | None = None
        self.since_best = 0  # evaluations since the best one
        self.stopped_early = False

    def _resolve(self, trainer: Trainer) -> tuple[str, str]:
        metric = self.monitor or trainer.task.monitor
        return metric, self.mode or monitor_mode(metric, trainer.task)

    def _better(self, value: float, mode: str) -> bool:
        return self.best is None or (value > self.best if mode == "max" else value < self.best)

    def on_start(self, trainer: Trainer) -> None:
        metric, mode = self._resolve(trainer)
        valid = sorted(k for k, v in _scalars(trainer.baseline).items() if isinstance(v, (int, float)))
        if metric not in valid:
            trainer.bar.close()  # the error starts on a line of its own
            raise ConfigError(
                f"train.monitor {metric!r} is not a metric of this task's evaluation; valid: {', '.join(valid)}"
            )
        for row in trainer.history.evals:  # a resumed run: the best and the count since it
            self._track(trainer, row["step"], row[metric], mode)

    def _track(self, trainer: Trainer, step: int, value: float, mode: str) -> bool:
        """Record one evaluation; True when it is a new best."""
        if self._better(value, mode):
            self.best, self.best_step, self.since_best = value, step, 0
            return True
        self.since_best += 1
        return False

    def on_evaluate(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        import copy

        metric, mode = self._resolve(trainer)
        if self._track(trainer, trainer.step, metrics[metric], mode):
            if self.restore_best:
                self.best_state = copy.deepcopy(trainer.model.state_dict())
            if self.save_best and trainer.write:
                trainer.save_best(metrics)
            return
        if self.patience is None:
            return
        if self.unit == "evaluation":
            waited = self.since_best
        else:
            scale = trainer.task.steps_per_epoch if self.unit == "epoch" else 1
            if scale is None:
                raise ValueError("EarlyStopping(unit='epoch') needs a task with epochs; use unit='step'")
            waited = (trainer.step - self.best_step) / scale
        if waited >= self.patience and not trainer.done:
            trainer.should_stop = self.stopped_early = True

    def on_relax(self, trainer: Trainer, subgroup: str) -> None:
        self.best, self.best_step, self.best_state, self.since_best = None, -1, None, 0

    def on_train_end(self, trainer: Trainer) -> None:
        if self.restore_best and self.best_state is not None:
            trainer.model.load_state_dict(self.best_state)
            trainer.last_eval = None

    def summary(self, trainer: Trainer) -> dict[str, Any]:
        metric, mode = self._resolve(trainer)
        return {
            "stopped_early": self.stopped_early,
            "best_step": self.best_step,
            "monitor": {"metric": metric, "mode": mode, "best": self.best},
            "patience": None if self.patience is None else {"value": self.patience, "unit": self.unit},
        }


class ReportWriter(Callback):
    """Writes what a person looks at (rank 0): ``metrics.json``, ``history.csv``, ``evals.json``,
    ``loss_curve.png`` and the task's plots, and prints the summary table."""

    def on_finish(self, trainer: Trainer, summary: dict[str, Any], final: dict[str, Any]) -> None:
        if trainer.dist.is_main:
            trainer._write_reports(summary, final, trainer.baseline)


class Trainer:
    """One training run; see the module docstring.

    Args:
        config: the validated experiment config (for a given ``model`` / ``task``, the optimiser,
            schedule, horizon, evaluation cadence and relaxation still come from it).
        out_dir: output folder (default ``config.train.out``).
        progress: show tqdm and print the summary (rank 0 only).
        model: train this model instead of building ``config.model`` (the global RNG is left alone).
        task: train on this :class:`~eqvit.train.tasks.Task` instead of building ``config.data``'s.
        callbacks: :class:`Callback` objects, called in order (after the :class:`ReportWriter` when
            ``write``).
        relaxation: a :class:`~eqvit.models.restrict.SymmetryRelaxation` (``{epoch: subgroup}``), the
            same as ``config.model.relaxation`` with unit ``epoch`` (give one or the other).
        write: write checkpoints, reports and TensorBoard logs into ``out_dir`` (``False``: nothing
            touches the disk, for in-memory runs such as :func:`~eqvit.train.classify.fit_classifier`).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        out_dir: str | Path | None = None,
        progress: bool = True,
        *,
        model: nn.Module | None = None,
        task: Task | None = None,
        callbacks: Sequence[Callback] = (),
        relaxation: Any = None,
        write: bool = True,
    ) -> None:
        self.config = config
        tcfg = config.train
        self.write = write
        # train.patience / train.monitor: early stopping, and OUT/best.safetensors for runs that write
        stopping = (
            [EarlyStopping(tcfg.patience, "evaluation", monitor=tcfg.monitor, restore_best=False, save_best=write)]
            if write or tcfg.patience is not None or tcfg.monitor is not None
            else []
        )
        self.callbacks: list[Callback] = [*([ReportWriter()] if write else []), *stopping, *callbacks]
        self.should_stop = False
        self.last_eval: tuple[int, dict[str, Any]] | None = None  # (step, metrics) of the latest evaluation
        self.last_batch_size = 0
        if relaxation is not None:
            if config.model.relaxation.schedule:
                raise ValueError("give the relaxation schedule once: model.relaxation or relaxation=, not both")
            config.model.relaxation = RelaxationConfig(unit="epoch", schedule=dict(relaxation.schedule))
        if write:
            check_out_path(out_dir, "--out")
        self.out = Path(out_dir if out_dir is not None else tcfg.out)
        self.device = torch.device(tcfg.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("train.device is 'cuda' but no CUDA device is available; use --device cpu")
        if tcfg.threads:
            torch.set_num_threads(tcfg.threads)
        self.dist = Distributed.from_env(self.device)
        if self.dist.world_size > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        if config.data.batch_size % self.dist.world_size:
            raise ValueError(
                f"data.batch_size {config.data.batch_size} must be divisible by the {self.dist.world_size} processes"
            )
        self.progress = progress and self.dist.is_main
        self._lock: RunLock | None = None
        self._saved_at: int | None = None  # the step of the checkpoint last written or resumed from
        self._clean_rng: tuple[int, dict[str, torch.Tensor]] | None = None  # see _mark_clean
        created = _missing_folders(self.out)
        if self.dist.is_main and write:  # a folder that cannot take the checkpoint is found now, not after training
            prepare_output_dir(self.out)
            self._lock = RunLock.acquire(self.out)
            clean_stale_temporaries(self.out)  # only the lock's holder may: a running writer's would go too
        try:
            self._setup(model, task)
        except BaseException:
            self.close()
            _remove_empty(created if self.dist.is_main and write else [])  # a failed start leaves no empty folder
            raise

    def _setup(self, model: nn.Module | None, task: Task | None) -> None:
        """Build (or take) the model and the task, the optimiser and the schedule: the rest of ``__init__``."""
        config, tcfg = self.config, self.config.train
        if task is None:
            check_dataset_name(config.data.name)
        if model is None:
            seed_everything(tcfg.seed)
            model = build_model(config)
        self.model = model.to(self.device)
        unroll = max([tcfg.rollout_steps, *tcfg.rollout_schedule.values()])
        name = (getattr(self.model, "default_cfg", None) or {}).get("architecture") or type(self.model).__name__
        batch = config.data.batch_size // self.dist.world_size
        check_training_memory(self.model, repr(name), batch, self.device, unroll, tcfg.amp)
        # the effective builder arguments, recorded so that eval / resume can compare theirs
        self.model_config = normalise_model_config(getattr(self.model, "config", None) or {})
        check_relaxation(self.model, config.model.relaxation.schedule)
        self.task = task if task is not None else build_task(config.data, self.model, self.device)
        self.horizon = self._horizon()
        self.eval_every = self._eval_every()
        self.relaxations = relaxation_steps(config, self.task.steps_per_epoch)
        self.relaxed: list[str] = []  # subgroups restricted to so far, in order
        check_multistep(tcfg, self.model, self.task)
        self._set_model(self.model)
        self.plateau = (
            torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer,
                mode=self.task.monitor_mode,
                factor=config.schedule.factor,
                patience=config.schedule.patience,
            )
            if config.schedule.name == "plateau"
            else None
        )
        self.step = 0
        self.history = History()
        # Seconds spent in training steps (this run and resumed ones); the time budget and the
        # time-based schedule count only these, so interleaved runs share a machine fairly.
        self.train_seconds = 0.0
        self.writer = self._tensorboard()

    def close(self) -> None:
        """Release the output folder's lock (:class:`~eqvit.train.checkpoint.RunLock`); idempotent."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ------------------------------------------------------------------ state
    def _horizon(self) -> int:
        """The step the LR schedule ends at: ``train.max_steps``, or ``train.max_epochs`` epochs."""
        tcfg = self.config.train
        if tcfg.max_epochs is None:
            return tcfg.max_steps
        return self._epochs_to_steps("max_epochs", tcfg.max_epochs, "max_steps", math.ceil)

    def _eval_every(self) -> int:
        tcfg = self.config.train
        if tcfg.eval_every_epochs is None:
            return tcfg.eval_every
        return self._epochs_to_steps("eval_every_epochs", tcfg.eval_every_epochs, "eval_every", round)

    def _epochs_to_steps(self, key: str, epochs: float, step_key: str, to_int: Callable[[float], int]) -> int:
        """``train.<key>`` epochs as a number of steps (at least 1); needs a dataset with epochs."""
        if self.task.steps_per_epoch is None:
            raise ValueError(
                f"train.{key} needs a dataset with epochs; data.name {self.config.data.name!r} streams "
                f"fresh samples (use train.{step_key})"
            )
        if epochs <= 0:
            raise ValueError(f"expected train.{key} > 0, got {epochs}")
        return max(1, to_int(epochs * self.task.steps_per_epoch))

    def _make_optimizer(self) -> torch.optim.Optimizer:
        ocfg = self.config.optim
        cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[ocfg.name]
        return cls(self.model.parameters(), lr=ocfg.lr, weight_decay=ocfg.weight_decay)

    def _set_model(self, model: nn.Module) -> None:
        """Use ``model`` from now on: a fresh optimiser (same param-group LR) and the compile / DDP wrappers."""
        lr = self.optimizer.param_groups[0]["lr"] if hasattr(self, "optimizer") else None
        self.model = model
        if self.config.train.grad_checkpointing:
            model.set_grad_checkpointing(True)
        self.optimizer = self._make_optimizer()
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        if getattr(self, "plateau", None) is not None:
            self.plateau.optimizer = self.optimizer
        self.network: nn.Module = self.model
        if self.config.train.compile:
            self.network = torch.compile(self.network)
        if self.dist.world_size > 1:
            self.network = nn.parallel.DistributedDataParallel(
                self.network, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )

    def _relax(self, subgroup: str) -> None:
        """Restrict the model to ``subgroup`` (:func:`restrict_model`; nothing when it already is that group)."""
        current = getattr(self.model, "frames", None) or self.model.group  # Platonic models restrict their frames
        if current.name != subgroup:
            self._set_model(restrict_model(self.model, subgroup).train(self.model.training))
            self.last_eval = None
            for callback in self.callbacks:
                callback.on_relax(self, subgroup)
        self.relaxed.append(subgroup)

    def _tensorboard(self):
        if not self.dist.is_main or not self.write:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            return None
        return SummaryWriter(str(self.out / "tensorboard"))

    def _current_rng(self) -> dict[str, torch.Tensor]:
        return {"rng.torch": torch.get_rng_state(), "rng.data": self.task.data_state()}

    def _mark_clean(self) -> None:
        """Remember the RNG states here, a point a resumed run continues from: before a step, after it, after
        its evaluation. A checkpoint written later at the same step count (a step or an evaluation that began
        but did not complete, and already drew its batch, dropout or sampling noise) saves these."""
        self._clean_rng = (self.step, self._current_rng())

    def _rng_tensors(self) -> dict[str, torch.Tensor]:
        """The RNG states that continue the run from ``self.step`` (:meth:`_mark_clean`)."""
        if self._clean_rng is not None and self._clean_rng[0] == self.step:
            return self._clean_rng[1]
        return self._current_rng()

    def _evaluation_missed(self) -> bool:
        """True for a run resumed from a checkpoint written between a step and its periodic evaluation."""
        due = bool(self.eval_every) and self.step > 0 and self.step % self.eval_every == 0
        return due and (not self.history.evals or self.history.evals[-1]["step"] != self.step)

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "last.safetensors"

    def save(self, metrics: dict[str, Any] | None = None, barrier: bool = True) -> None:
        """Atomically write ``OUT/last.safetensors`` + ``OUT/last.json`` (rank 0; nothing without ``write``).

        Stop signals wait until the write is complete; ``barrier=False`` skips the wait for the other ranks
        (a run that stops on an error or a signal that may not have reached them).
        """
        if not self.write:
            return
        if self.dist.is_main:
            extra = {
                "history": {"train": self.history.train, "evals": self.history.evals},
                "elapsed_seconds": self.train_seconds,
                "plateau": self.plateau.state_dict() if self.plateau is not None else None,
                "world_size": self.dist.world_size,
                "relaxed": self.relaxed,
                "model_config": self.model_config,
            }
            with shielded():
                save_checkpoint(
                    self.out,
                    self.model,
                    step=self.step,
                    config=self.config.to_dict(),
                    metrics=metrics,
                    optimizer=self.optimizer,
                    extra=extra,
                    extra_tensors=self._rng_tensors(),
                )
                self._saved_at = self.step
        if barrier:
            self.dist.barrier()

    def save_best(self, metrics: dict[str, Any]) -> None:
        """Write the model as ``OUT/best.safetensors`` + ``best.json`` (weights, config, step, the evaluation;
        no optimiser: ``eqvit eval`` / ``export`` read it, resuming reads ``last``). Rank 0 only."""
        if not self.write or not self.dist.is_main:
            return
        with shielded():
            save_checkpoint(
                self.out,
                self.model,
                step=self.step,
                config=self.config.to_dict(),
                metrics=_eval_row(self.step, metrics),
                extra={"relaxed": list(self.relaxed), "model_config": self.model_config},
                name="best",
            )

    def resume(self, path: str | Path | None = None) -> bool:
        """Restore everything from ``path`` (default ``OUT/last.safetensors``); False if absent."""
        path = Path(path) if path is not None else self.out / "last.safetensors"
        if not path.is_file():
            return False
        tensors, sidecar = load_checkpoint(path)
        check_model_config(sidecar, self.config.model.name, self.config.model.kwargs, self.model, str(path))
        check_resume_state(tensors, sidecar, path)
        relaxed = list(sidecar.get("relaxed", []))
        if relaxed != [name for _, name in self.relaxations[: len(relaxed)]]:
            raise CheckpointError(
                f"checkpoint {path} was restricted to {relaxed}, which model.relaxation.schedule does not start with"
            )
        for name in relaxed:
            self._relax(name)
        load_model_state(self.model, tensors, str(path))
        restore_optimizer_state(self.optimizer, tensors, sidecar["optimizer"], path)
        if self.plateau is not None and sidecar.get("plateau"):
            self.plateau.load_state_dict(sidecar["plateau"])
        changed = self._apply_optimizer_settings(sidecar)
        try:
            self.task.load_data_state(tensors["rng.data"])
        except (RuntimeError, ValueError, IndexError) as err:
            raise CheckpointError(f"checkpoint {path}: its data stream state (rng.data) does not fit: {err}") from None
        torch.set_rng_state(tensors["rng.torch"])
        self.step = self._saved_at = int(sidecar["step"])
        self.history = History(sidecar["history"]["train"], sidecar["history"]["evals"])
        self.train_seconds = float(sidecar.get("elapsed_seconds", 0.0))
        if changed and self.progress:
            print(
                f"resuming {path} with optimiser settings of this config, not of its run: {'; '.join(changed)}",
                file=sys.stderr,
            )
        return True

    def _apply_optimizer_settings(self, sidecar: dict[str, Any]) -> list[str]:
        """Set the restored optimiser's and plateau schedule's hyper-parameters to this config's (the LR follows
        the schedule at every step anyway); their state (moments, step counts, the best so far) stays the
        checkpoint's. Returns the settings that differ from the checkpoint run's, as
        ``"optim.weight_decay 0.5 (the run had 0.0)"``."""
        fresh = self._make_optimizer().defaults
        for group in self.optimizer.param_groups:
            group.update({k: v for k, v in fresh.items() if k != "lr"})
        if self.plateau is not None:
            self.plateau.factor = self.config.schedule.factor
            self.plateau.patience = self.config.schedule.patience
        config = sidecar.get("config") if isinstance(sidecar.get("config"), dict) else {}
        changed = []
        for section in ("optim", "schedule"):
            recorded, now = config.get(section), dataclasses.asdict(getattr(self.config, section))
            if isinstance(recorded, dict):
                changed += [
                    f"{section}.{key} {now[key]!r} (the run had {recorded[key]!r})"
                    for key in now
                    if key in recorded and recorded[key] != now[key]
                ]
        return changed

    # ------------------------------------------------------------------ loop
    def _local_batch(self, rollout_steps: int = 1) -> tuple[Inputs, torch.Tensor]:
        """This rank's slice of the global batch; ``rollout_steps`` K > 1: targets ``[K, B, ...]``."""
        # Every rank draws the same global batch (same generator state) and keeps its slice.
        x, y = self.task.train_batch() if rollout_steps == 1 else self.task.train_rollout_batch(rollout_steps)
        if self.dist.world_size == 1:
            return x, y
        world, rank = self.dist.world_size, self.dist.rank
        y = y.chunk(world, dim=0 if rollout_steps == 1 else 1)[rank]
        if isinstance(x, tuple):
            return tuple(t.chunk(world)[rank] for t in x), y
        return x.chunk(world)[rank], y

    def _autocast(self):
        if not self.config.train.amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _sdpa_context(self):
        backend = self.config.train.sdpa_backend
        if backend is None or self.device.type != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        names = {
            "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
        }
        if backend not in names:
            raise ValueError(f"unknown sdpa_backend {backend!r}; valid: {', '.join(names)}")
        return sdpa_kernel(names[backend])

    def train_step(self) -> float:
        """One optimiser step on one global batch, recorded in ``history``; returns the global loss.

        The update, the step count and the record are one unit that stop signals wait for: a checkpoint
        never holds half of an update, or an update without its step.
        """
        begin = time.perf_counter()
        ocfg, tcfg = self.config.optim, self.config.train
        max_steps, max_minutes = self.horizon, tcfg.max_minutes
        while len(self.relaxed) < len(self.relaxations) and self.relaxations[len(self.relaxed)][0] <= self.step:
            self._relax(self.relaxations[len(self.relaxed)][1])
            if self.progress:
                self.bar.write(f"step {self.step}: restricted to {self.model.group.name} (model.relaxation)")
        elapsed = self.train_seconds
        frac = (
            self.step / max_steps if max_minutes is None else max(self.step / max_steps, elapsed / (60 * max_minutes))
        )
        if self.plateau is None:
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate(ocfg.lr, self.config.schedule, frac, self.step)
        steps = rollout_steps_at(tcfg, self.step)
        x, y = self._local_batch(steps)
        self.last_batch_size = len(x if steps > 1 else y) * self.dist.world_size
        with self._autocast(), self._sdpa_context():
            if steps == 1:
                loss = self.task.loss(_call(self.network, x).float(), y)
            else:
                loss = unrolled_loss(self.network, self.task, x, y, tcfg.rollout_discount)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        global_loss = loss.detach()
        if self.dist.world_size > 1:
            dist.all_reduce(global_loss)
            global_loss /= self.dist.world_size
        value = global_loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at step {self.step + 1}; training stopped before that step")
        with shielded():
            if ocfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), ocfg.grad_clip)
            self.optimizer.step()
            self.step += 1
            self.train_seconds += time.perf_counter() - begin
            self.history.train.append({"step": self.step, "time_s": self.train_seconds, "loss": value})
        return value

    def evaluate(self) -> dict[str, Any]:
        with self._autocast():
            return self.task.evaluate(self.model)

    def _validate(self, schedule: bool = True) -> dict[str, Any]:
        """Evaluate, record the row and tell the callbacks (the periodic evaluations and the last one;
        ``schedule``: let the plateau schedule see it)."""
        metrics = self.evaluate()
        self.last_eval = (self.step, metrics)
        self.history.evals.append(_eval_row(self.step, metrics))
        if schedule and self.plateau is not None:
            self.plateau.step(metrics[self.task.monitor])
        for callback in self.callbacks:
            callback.on_evaluate(self, metrics)
        return metrics

    def fit(self, max_steps: int | None = None, max_minutes: float | None = None) -> dict[str, Any]:
        """Train, then evaluate and write the reports (``start``, ``train_for``, ``finish``)."""
        self.start(max_steps, max_minutes)
        self.train_for(math.inf)
        return self.finish()

    def start(self, max_steps: int | None = None, max_minutes: float | None = None) -> None:
        """Prepare a run: persistence scores, output folder, progress bar.

        ``max_steps`` stops the run at that step without changing the LR schedule, whose horizon
        stays ``train.max_steps`` or ``train.max_epochs`` (so ``--max-steps 3`` then ``--resume`` equals one run);
        ``max_minutes`` overrides ``train.max_minutes`` (a time horizon for the schedule too).
        """
        tcfg = self.config.train
        self.stop_step = max_steps if max_steps is not None else self.horizon
        if max_minutes is not None:
            tcfg.max_minutes = max_minutes
        if self.dist.is_main and self.write:
            self.out.mkdir(parents=True, exist_ok=True)
        self.baseline = self.task.evaluate(None)
        # A time budget that binds before the step limit gets a bar in seconds, not in steps.
        self._bar_in_seconds = tcfg.max_minutes is not None and self.stop_step > 10_000
        total, done, unit = (
            (round(60 * tcfg.max_minutes), round(self.train_seconds), "s")
            if self._bar_in_seconds
            else (self.stop_step, self.step, "step")
        )
        self.bar = tqdm(
            total=total,
            initial=done,
            unit=unit,
            desc=self.config.model.name,
            disable=not self.progress,
            dynamic_ncols=True,
        )
        self._running: float | None = None
        for callback in self.callbacks:
            callback.on_start(self)

    @property
    def done(self) -> bool:
        tcfg = self.config.train
        out_of_time = tcfg.max_minutes is not None and self.train_seconds >= 60 * tcfg.max_minutes
        return self.step >= self.stop_step or out_of_time or self.should_stop

    def train_for(self, seconds: float) -> bool:
        """Train for about ``seconds`` of step time (or until done); returns ``done``."""
        tcfg = self.config.train
        until = self.train_seconds + seconds
        self.model.train()
        with self._keeping_progress():
            if self._evaluation_missed():
                self._validate()
            while not self.done and self.train_seconds < until:
                self._mark_clean()
                loss = self.train_step()
                self._mark_clean()
                self._running = loss if self._running is None else 0.9 * self._running + 0.1 * loss
                if self.writer is not None:
                    self.writer.add_scalar("train/loss", loss, self.step)
                for callback in self.callbacks:
                    callback.on_step(self, loss)
                self.bar.update(round(self.train_seconds) - self.bar.n if self._bar_in_seconds else 1)
                if self.step % tcfg.log_every == 0:
                    rate = self.config.data.batch_size * len(self.history.train) / max(self.train_seconds, 1e-9)
                    lr = self.optimizer.param_groups[0]["lr"]
                    self.bar.set_postfix(
                        step=self.step, loss=f"{self._running:.4f}", lr=f"{lr:.1e}", samples_s=f"{rate:.2f}"
                    )
                if self.eval_every and self.step % self.eval_every == 0:
                    self._validate()
                    self._mark_clean()
                if tcfg.checkpoint_every and self.step % tcfg.checkpoint_every == 0:
                    self.save()
        return self.done

    @contextlib.contextmanager
    def _keeping_progress(self):
        """Stop signals (SIGINT, SIGTERM, SIGHUP) and errors inside keep the last completed step: its checkpoint
        is written (with the RNG states from before an unfinished step) before the signal or the error goes on,
        which then says where it is (``Interrupted.checkpoint``; a note on an error)."""
        with stop_signals():
            try:
                yield
            except BaseException as err:
                self.bar.close()  # the message starts on a line of its own
                if isinstance(err, (KeyboardInterrupt, Exception)):
                    self._keep_last_step(err)
                raise

    def _keep_last_step(self, err: BaseException) -> None:
        """Write the checkpoint of the last completed step, if it is not on disk yet, and tell ``err`` about it."""
        if not self.write or not self.dist.is_main:
            return
        path = self.checkpoint_path
        try:
            if self._saved_at != self.step and self.step > 0:
                with shielded(drop=True):  # a second signal does not cut this write
                    self.save(barrier=False)
        except CheckpointError as save_err:
            err.add_note(f"the checkpoint of step {self.step} could not be written: {save_err}")
            return
        if self._saved_at is None:
            err.add_note("no checkpoint was written: no training step had completed")
            return
        if isinstance(err, Interrupted):
            err.checkpoint = str(path)
        # A diverged loss comes back on resume with the same settings: say what to change first.
        how = (
            "lower optim.lr (or set optim.grad_clip) in the config, then continue with --resume"
            if isinstance(err, FloatingPointError)
            else "continue with --resume"
        )
        err.add_note(f"the checkpoint of step {self._saved_at} (the last completed) is in {path}; {how}")

    def finish(self) -> dict[str, Any]:
        """Final evaluation, checkpoint and reports; returns the summary (the full evaluation, with
        non-scalar results such as the error map, stays in ``self.final_evaluation``). Releases the output
        folder's lock."""
        with self._keeping_progress():
            summary = self._finish()
        self.close()
        return summary

    def _finish(self) -> dict[str, Any]:
        self.bar.close()
        if self.last_eval is None or self.last_eval[0] != self.step:  # the model as trained, after its last step
            if self.history.evals and self.history.evals[-1]["step"] == self.step:
                self.last_eval = (self.step, self.evaluate())  # scored before a resume: the row is there
            else:
                self._validate(schedule=False)
        for callback in self.callbacks:
            callback.on_train_end(self)
        if self.last_eval is None or self.last_eval[0] != self.step:  # a callback changed the weights
            self.last_eval = (self.step, self.evaluate())
        final = self.final_evaluation = self.last_eval[1]
        task, monitor = self.task, self.task.monitor
        pick = max if task.monitor_mode == "max" else min
        best = pick(self.history.evals, key=lambda row: row[monitor])
        spe = task.steps_per_epoch
        summary = {
            "model": self.config.model.name,
            "dataset": self.config.data.name,
            "params": sum(p.numel() for p in self.model.parameters()),
            "steps": self.step,
            "epochs": self.step / spe if spe else None,
            "train_seconds": self.train_seconds,
            "seconds_per_step": self.train_seconds / max(len(self.history.train), 1),
            "world_size": self.dist.world_size,
            "group": getattr(getattr(self.model, "group", None), "name", None),
            "relaxed": list(self.relaxed),
            "metrics": _scalars(final),
            task.baseline_name: _scalars(self.baseline),
            f"best_{monitor}": {"step": best["step"], monitor: best[monitor]},
        }
        summary.update(task.summary(final, self.baseline))
        if hasattr(task, "evaluate_test"):  # tasks with a held-out test split (QM9) score it once, here
            summary.update(task.evaluate_test(self.model))
        for callback in self.callbacks:
            summary.update(callback.summary(self))
        self.save(metrics=summary["metrics"])
        for callback in self.callbacks:
            callback.on_finish(self, summary, final)
        return summary

    def _write_reports(self, summary: dict[str, Any], final: dict[str, Any], baseline: dict[str, Any]) -> None:
        out, name, task = self.out, self.config.model.name, self.task
        (out / "metrics.json").write_text(json.dumps(summary, indent=2))
        with open(out / "history.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=["step", "time_s", "loss"])
            writer.writeheader()
            writer.writerows(self.history.train)
        (out / "evals.json").write_text(json.dumps(self.history.evals, indent=2))
        events = [(step, group) for (step, group), _ in zip(self.relaxations, self.relaxed)]
        events += rollout_events(self.config.train, self.step)
        _plot_history(self.history, task, baseline, out / "loss_curve.png", name, events)
        plots = task.write_plots(final, out, name)
        if self.writer is not None:
            for key, value in _eval_row(self.step, final).items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(f"val/{key}", value, self.step)
            self.writer.close()
        if self.progress:
            steps_run = len(self.history.train)
            epochs = f", {summary['epochs']:.1f} epochs" if summary["epochs"] is not None else ""
            print(
                f"\n{name}: {summary['params'] / 1e6:.2f}M params, {self.step} steps{epochs} "
                f"({steps_run} logged) in {summary['train_seconds']:.0f} s"
            )
            print(task.table([(name, final), (task.baseline_name.replace("_", " "), baseline)]))
            print(task.verdict(summary))
            files = ", ".join(["metrics.json", "history.csv", "loss_curve.png", *plots])
            best = " and best.safetensors (+ best.json)" if (out / "best.safetensors").is_file() else ""
            print(f"wrote {out}/last.safetensors (+ last.json){best}, {files}")


def train(
    config: ExperimentConfig,
    out_dir: str | Path | None = None,
    max_steps: int | None = None,
    max_minutes: float | None = None,
    progress: bool = True,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train ``config`` (optionally resuming from ``OUT/last.safetensors``); returns the summary.

    An ``OUT`` that already holds a run (its last or its best checkpoint) is refused unless ``resume``
    (continue it) or ``overwrite`` (replace its checkpoints: the previous run's best ones are removed
    when the new run starts); one that another run is writing to is refused in any case
    (:class:`~eqvit.train.checkpoint.RunLock`).
    """
    check_out_path(out_dir, "--out")
    out = Path(out_dir if out_dir is not None else config.train.out)
    main = int(os.environ.get("RANK", "0")) == 0  # under torchrun, rank 0 owns the folder
    if main:
        _check_out(out, resume, overwrite)
    trainer = Trainer(config, out, progress)
    try:
        if main:
            _check_out(out, resume, overwrite)  # again, now that the folder's lock is ours
        if overwrite and main:
            for name in ("best.safetensors", "best.json"):  # a new run's best must not be the old one's
                (out / name).unlink(missing_ok=True)
        if resume and not trainer.resume() and trainer.progress:
            print(f"no checkpoint in {trainer.out}; starting from scratch")
        return trainer.fit(max_steps, max_minutes)
    finally:
        trainer.close()


def _check_out(out: Path, resume: bool, overwrite: bool) -> None:
    """The checks of :func:`train` on its output folder: not another run's, and not one that holds a run
    unless resuming or overwriting it."""
    RunLock.check_free(out)  # refused, naming the process, while another run writes there
    if resume:
        check_resumable(out)
    elif not overwrite:
        check_no_previous_run(out)


def load_for_evaluation(config: ExperimentConfig, checkpoint: str | Path) -> tuple[nn.Module, Any]:
    """The checkpoint's model (checked against ``config``, restricted as the run was) and its task."""
    tensors, sidecar = load_checkpoint(checkpoint)
    device = torch.device(config.train.device)
    check_dataset_name(config.data.name)
    model = build_model(config).to(device)
    check_model_config(sidecar, config.model.name, config.model.kwargs, model, str(checkpoint))
    for subgroup in sidecar.get("relaxed", []):
        model = restrict_model(model, subgroup)
    load_model_state(model, tensors, str(checkpoint))
    return model, build_task(config.data, model, device)


def evaluate_checkpoint(config: ExperimentConfig, checkpoint: str | Path, progress: bool = True) -> dict[str, Any]:
    """Score a saved checkpoint of ``config``'s model on the validation set.

    Returns ``{"metrics": ..., <baseline name>: ...}`` (``"persistence"``, ``"majority_class"``).
    """
    model, task = load_for_evaluation(config, checkpoint)
    final, baseline = task.evaluate(model), task.evaluate(None)
    name = task.baseline_name
    if progress:
        print(task.table([(config.model.name, final), (name.replace("_", " "), baseline)]))
    return {"metrics": _scalars(final), name: _scalars(baseline)}
