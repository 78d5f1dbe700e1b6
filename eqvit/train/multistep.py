"""Multi-step training: the loss over K autoregressive steps, gradients through the unroll.

From a batch of initial states ``x`` and the solver's next K states ``targets[0..K-1]`` the model
predicts ``pred_1 = model(x)``, ``pred_k = model(pred_{k-1})``, and the loss is the mean of the task's
one-step loss over the K steps, ``(1/K) sum_k loss(pred_k, targets[k-1])``. Nothing is detached:
the gradient of step k's term runs back through all k applications of the model, which is what
teaches a model to correct the errors it feeds itself (the multi-step fine-tuning of the
FourCastNet / SFNO line of work). K = 1 is one-step training, exactly.

The step's K comes from ``train.rollout_steps`` and the curriculum ``train.rollout_schedule``
(:func:`rollout_steps_at`). Memory grows with K: every application's activations are kept for
backward. ``train.grad_checkpointing`` keeps only each block's input and recomputes the rest in
backward (``model.set_grad_checkpointing()``), for about a third more compute.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from eqvit.train.config import TrainConfig

__all__ = ["check_multistep", "max_rollout_steps", "rollout_events", "rollout_steps_at", "unrolled_loss"]


def rollout_steps_at(cfg: TrainConfig, step: int) -> int:
    """K for the optimiser step after ``step`` steps: the value of the largest ``rollout_schedule`` key
    ``<= step``, else ``rollout_steps``."""
    keys = [k for k in cfg.rollout_schedule if k <= step]
    return cfg.rollout_schedule[max(keys)] if keys else cfg.rollout_steps


def rollout_events(cfg: TrainConfig, last_step: int) -> list[tuple[int, str]]:
    """``(step, "K=k")`` where the curriculum changes K, up to ``last_step`` (for the loss-curve plot)."""
    events, current = [], cfg.rollout_steps
    for step in sorted(cfg.rollout_schedule):
        k = cfg.rollout_schedule[step]
        if step <= last_step and k != current:
            events.append((step, f"K={k}"))
        current = k
    return events


def max_rollout_steps(cfg: TrainConfig) -> int:
    """The largest K the run trains with."""
    return max([cfg.rollout_steps, *cfg.rollout_schedule.values()])


def check_multistep(cfg: TrainConfig, model: nn.Module, task: Any) -> None:
    """ValueError now, not at the step where K first exceeds 1: a task that cannot give K-step targets,
    or ``grad_checkpointing`` on a model without ``set_grad_checkpointing``."""
    if max_rollout_steps(cfg) > 1 and not hasattr(task, "train_rollout_batch"):
        raise ValueError(
            f"train.rollout_steps / train.rollout_schedule up to K = {max_rollout_steps(cfg)} need a task whose "
            f"model predicts its own next input (data.name: shallow_water), got {type(task).__name__}"
        )
    if cfg.grad_checkpointing and not hasattr(model, "set_grad_checkpointing"):
        raise ValueError(
            f"train.grad_checkpointing needs a model with set_grad_checkpointing() (timm's models and eqvit's "
            f"EquivariantViT), got {type(model).__name__}"
        )


def unrolled_loss(
    network: nn.Module, task: Any, x: torch.Tensor, targets: torch.Tensor, discount: float = 1.0
) -> torch.Tensor:
    """Weighted mean of ``task.loss`` over K autoregressive steps: step k weighs ``discount ** (k - 1)``.

    Args:
        network: maps a state ``[B, C, ...]`` to the next one.
        task: gives ``loss(pred, target)`` (a scalar per step).
        x: initial states ``[B, C, ...]``.
        targets: the next K states ``[K, B, C, ...]``.
        discount: γ > 0; 1 averages the steps, γ < 1 leans towards the first ones.
    """
    if targets.ndim != x.ndim + 1 or tuple(targets.shape[1:]) != tuple(x.shape):
        raise ValueError(
            f"expected targets of shape [K, {', '.join(map(str, x.shape))}] for inputs {list(x.shape)}, "
            f"got {list(targets.shape)}"
        )
    if not discount > 0:
        raise ValueError(f"expected a discount > 0, got {discount}")
    weights = [discount**k for k in range(len(targets))]
    pred, total = x, 0.0
    for weight, target in zip(weights, targets):
        pred = network(pred)
        total = total + weight * task.loss(pred.float(), target)
    return total / sum(weights)
