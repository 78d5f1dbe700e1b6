"""A small image-classification loop for the O(2)-subgroup ViTs (seed App. F defaults).

AdamW (lr 1e-3, betas 0.9 / 0.999, weight decay 0.05), unweighted cross-entropy, mean accuracy on
the validation set after every epoch, early stopping on validation accuracy, and optional gradual
symmetry breaking (:class:`~eqvit.models.restrict.SymmetryRelaxation`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from eqvit.models.restrict import SymmetryRelaxation


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


def _optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)


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
    relaxation: SymmetryRelaxation | None = None,
    seed: int = 0,
    eval_every: int = 1,
) -> tuple[nn.Module, ClassifierHistory]:
    """Train ``model`` on ``train = (x, y)``; returns the best model (by validation accuracy) and the history.

    The validation accuracy is computed every ``eval_every`` epochs and after the last one; early
    stopping ends the run when ``patience`` epochs have passed since the best evaluation.

    With ``relaxation``, the model is restricted to a subgroup at the scheduled epochs (the same
    function, so the loss is continuous there) and the optimizer restarts.
    """
    if epochs < 1:
        raise ValueError(f"expected epochs >= 1, got {epochs}")
    if eval_every < 1:
        raise ValueError(f"expected eval_every >= 1, got {eval_every}")
    x, y = train
    gen = torch.Generator().manual_seed(seed)
    opt = _optimizer(model, lr, weight_decay)
    history = ClassifierHistory()
    best_state, best = None, -1.0
    for epoch in range(epochs):
        if relaxation is not None:
            model, changed = relaxation.step(model, epoch)
            if changed:
                opt = _optimizer(model, lr, weight_decay)
                best_state, best = None, -1.0  # earlier checkpoints belong to another architecture
        model.train()
        perm = torch.randperm(len(x), generator=gen)
        total, count = 0.0, 0
        for start in range(0, len(x), batch_size):
            idx = perm[start : start + batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
        history.train_loss.append(total / count)
        history.group.append(getattr(getattr(model, "group", None), "name", "none"))
        if (epoch + 1) % eval_every and epoch + 1 < epochs:
            history.val_accuracy.append(float("nan"))
            continue
        acc = accuracy(model, *val)
        history.val_accuracy.append(acc)
        if acc > best:
            best, history.best_epoch, best_state = acc, epoch, copy.deepcopy(model.state_dict())
        elif patience is not None and epoch - history.best_epoch >= patience:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    return model, history
