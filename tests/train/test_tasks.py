"""The one engine: fit_classifier is the Trainer on a TensorClassificationTask with callbacks."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from eqvit.train.classify import ClassifierHistory, classifier_config, fit_classifier
from eqvit.train.engine import Callback, EarlyStopping, Trainer
from eqvit.train.tasks import Task, TensorClassificationTask


def data(n: int = 24, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=gen)
    return x, (x[:, 0] > 0).long()


def linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


class Recorder(Callback):
    def __init__(self, stop_after: int | None = None) -> None:
        self.events: list[str] = []
        self.stop_after = stop_after

    def on_start(self, trainer):
        self.events.append("start")

    def on_step(self, trainer, loss):
        self.events.append(f"step{trainer.step}")
        if self.stop_after is not None and trainer.step >= self.stop_after:
            trainer.should_stop = True

    def on_evaluate(self, trainer, metrics):
        self.events.append(f"eval{trainer.step}")

    def on_train_end(self, trainer):
        self.events.append("end")

    def on_finish(self, trainer, summary, final):
        self.events.append("finish")
        self.summary = summary


def test_tensor_task_is_a_task_and_epochs_follow_one_generator():
    task = TensorClassificationTask(data(), data(8, 1), batch_size=10, seed=3)
    assert isinstance(task, Task) and task.steps_per_epoch == 3 and task.classes == ["0", "1"]
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        perm = torch.randperm(24, generator=gen)
        for b in range(3):
            (x,), _ = task.train_batch()
            torch.testing.assert_close(x, data()[0][perm[10 * b : 10 * (b + 1)]])
    state = task.data_state()
    (x1,), _ = task.train_batch()
    task.load_data_state(torch.tensor([0]))
    task.load_data_state(state)  # a resumed stream replays the generator
    (x2,), _ = task.train_batch()
    torch.testing.assert_close(x1, x2)


def test_callbacks_see_the_run_in_order_and_may_stop_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = TensorClassificationTask(data(), data(8, 1), batch_size=12)
    rec = Recorder(stop_after=3)
    trainer = Trainer(
        classifier_config(epochs=4, batch_size=12), model=linear(), task=task, callbacks=[rec], write=False
    )
    summary = trainer.fit()
    assert rec.events == ["start", "step1", "step2", "eval2", "step3", "eval3", "end", "finish"]
    assert summary["steps"] == 3 and summary["epochs"] == 1.5 and rec.summary is summary
    assert list(tmp_path.iterdir()) == []  # write=False: nothing on disk


def test_fit_classifier_early_stopping_restores_the_best_model():
    x, y = data(48)
    _, history = fit_classifier(linear(), (x, y), (x[:8], y[:8]), epochs=30, batch_size=16, lr=3e-2, patience=2)
    assert isinstance(history, ClassifierHistory)
    assert len(history.train_loss) == len(history.val_accuracy) == len(history.group) == history.epochs
    assert history.epochs < 30 or history.best_epoch == 29
    assert history.best_accuracy == max(a for a in history.val_accuracy if not math.isnan(a))
    assert history.epochs - 1 - history.best_epoch <= 2
    # eval_every: NaN for the epochs between evaluations, the last one always scored
    _, history = fit_classifier(linear(), (x, y), (x[:8], y[:8]), epochs=5, batch_size=16, eval_every=2)
    assert [math.isnan(a) for a in history.val_accuracy] == [True, False, True, False, False]


def test_early_stopping_validates_and_relaxation_is_given_once():
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(-1)
    from eqvit.models.restrict import SymmetryRelaxation

    config = classifier_config(epochs=1)
    config.model.relaxation.schedule = {1: "C1"}
    task = TensorClassificationTask(data(), data(8, 1), batch_size=12)
    with pytest.raises(ValueError, match="once"):
        Trainer(config, model=linear(), task=task, relaxation=SymmetryRelaxation({1: "C1"}), write=False)
