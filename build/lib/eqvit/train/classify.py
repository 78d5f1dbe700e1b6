"""Image / point-cloud classification on in-memory tensors, through the one training engine.

:func:`fit_classifier` is the O(2) seed's App. F recipe (AdamW lr 1e-3, betas 0.9 / 0.999, weight
decay 0.05, unweighted cross-entropy, validation accuracy after every epoch, early stopping on it,
optional gradual symmetry breaking with :class:`~eqvit.models.restrict.SymmetryRelaxation`) run by
:class:`~eqvit.train.engine.Trainer` on a :class:`~eqvit.train.tasks.TensorClassificationTask`, with the
:class:`~eqvit.train.engine.EarlyStopping` callback and :class:`ClassifierHistoryCallback`, which keeps
the per-epoch history the benchmarks report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from eqvit.train.engine import Callback, EarlyStopping, Trainer


@dataclass
class ClassifierHistory:
    """Per-epoch train loss, validation accuracy and the group the model was equivariant to."""

    train_loss: list[float] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)  # NaN for epochs without evaluation
    group: list[str] = field(default_factory=list)
    best_epoch: int = -1

    @property
    def best_accuracy(self) -> float:
        return self.val_accuracy[self.best_epoch] if self.best_epoch >= 0 else float("nan")

    @property
    def epochs(self) -> int:
        """Epochs trained (fewer than asked for when early stopping ended the run)."""
        return len(self.train_loss)


class ClassifierHistoryCallback(Callback):
    """Fills a :class:`ClassifierHistory`: the sample-weighted mean training loss of each epoch, the
    group after it, and the validation accuracy of the epochs that were evaluated (NaN otherwise)."""

    def __init__(self, early_stopping: EarlyStopping | None = None) -> None:
        self.history = ClassifierHistory()
        self.early_stopping = early_stopping
        self._total, self._count = 0.0, 0

    def on_step(self, trainer: Trainer, loss: float) -> None:
        self._total += loss * trainer.last_batch_size
        self._count += trainer.last_batch_size
        if trainer.step % trainer.task.steps_per_epoch == 0:
            self.history.train_loss.append(self._total / self._count)
            self.history.val_accuracy.append(float("nan"))
            self.history.group.append(getattr(getattr(trainer.model, "group", None), "name", "none"))
            self._total, self._count = 0.0, 0

    def on_evaluate(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        epoch = -(-trainer.step // trainer.task.steps_per_epoch) - 1
        if 0 <= epoch < len(self.history.val_accuracy):
            self.history.val_accuracy[epoch] = metrics["accuracy"]

    def on_train_end(self, trainer: Trainer) -> None:
        stop = self.early_stopping
        if stop is not None and stop.best_state is not None:
            self.history.best_epoch = -(-stop.best_step // trainer.task.steps_per_epoch) - 1


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 256) -> float:
    """Fraction of correct argmax predictions (eval mode)."""
    was = model.training
    model.eval()
    correct = 0
    for start in range(0, len(x), batch_size):
        correct += (model(x[start : start + batch_size]).argmax(-1) == y[start : start + batch_size]).sum().item()
    model.train(was)
    return correct / max(len(x), 1)


def classifier_config(
    *,
    epochs: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    weight_decay: float = 0.05,
    seed: int = 0,
    eval_every: int | None = 1,
    device: str = "cpu",
):
    """The :class:`~eqvit.train.config.ExperimentConfig` of :func:`fit_classifier`: AdamW at a constant
    LR, no gradient clipping, ``epochs`` epochs, validation every ``eval_every`` epochs (``None``: only
    after the last one)."""
    from eqvit.train.config import DataConfig, ExperimentConfig, ModelConfig, OptimConfig, ScheduleConfig, TrainConfig

    return ExperimentConfig(
        model=ModelConfig(name="model"),
        data=DataConfig(name="tensors", batch_size=batch_size),
        optim=OptimConfig(name="adamw", lr=lr, weight_decay=weight_decay, grad_clip=None),
        schedule=ScheduleConfig(name="constant", warmup_steps=0),
        train=TrainConfig(
            max_epochs=epochs,
            eval_every=0,
            eval_every_epochs=eval_every,
            seed=seed,
            device=device,
            log_every=10**9,
        ),
    )


def fit_classifier(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    *,
    epochs: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    weight_decay: float = 0.05,
    patience: int | None = None,
    relaxation: Any = None,
    seed: int = 0,
    eval_every: int = 1,
    callbacks: tuple[Callback, ...] = (),
) -> tuple[nn.Module, ClassifierHistory]:
    """Train ``model`` on ``train = (x, y)``; returns the best model (by validation accuracy) and the history.

    The validation accuracy is computed every ``eval_every`` epochs and after the last one; early
    stopping ends the run when ``patience`` epochs have passed since the best evaluation.

    With ``relaxation`` (a :class:`~eqvit.models.restrict.SymmetryRelaxation`), the model is restricted
    to a subgroup at the scheduled epochs (the same function, so the loss is continuous there) and the
    optimizer restarts: the Trainer's ``model.relaxation``, the same :func:`eqvit.restrict` call.
    ``callbacks``: more :class:`~eqvit.train.engine.Callback` objects for the run.
    """
    if epochs < 1:
        raise ValueError(f"expected epochs >= 1, got {epochs}")
    if eval_every < 1:
        raise ValueError(f"expected eval_every >= 1, got {eval_every}")
    from eqvit.train.tasks import TensorClassificationTask

    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    config = classifier_config(
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        weight_decay=weight_decay,
        seed=seed,
        eval_every=eval_every,
        device=device.type,
    )
    task = TensorClassificationTask(train, val, batch_size=batch_size, seed=seed, device=device, model=model)
    stopping = EarlyStopping(patience)
    recorder = ClassifierHistoryCallback(stopping)
    trainer = Trainer(
        config,
        progress=False,
        model=model,
        task=task,
        callbacks=(stopping, recorder, *callbacks),
        relaxation=relaxation,
        write=False,
    )
    trainer.fit()
    return trainer.model, recorder.history
