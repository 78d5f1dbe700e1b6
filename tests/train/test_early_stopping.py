"""Early stopping in the engine: ``train.patience`` / ``train.monitor``, ``best.safetensors``, ``metrics.json``.

The task below is a real :class:`TensorClassificationTask` whose validation scores are replaced by a
script, so that when the run must stop, and which step was best, is known in advance.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from eqvit.train.checkpoint import load_checkpoint, model_state
from eqvit.train.config import ConfigError, ExperimentConfig, ModelConfig, TrainConfig, from_dict
from eqvit.train.engine import Trainer
from eqvit.train.tasks import TensorClassificationTask


class ScriptedTask(TensorClassificationTask):
    """Validation ``accuracy`` / ``val_loss`` read from lists, one entry per evaluation."""

    def __init__(self, accuracy: list[float], val_loss: list[float], **kwargs) -> None:
        gen = torch.Generator().manual_seed(0)
        x, y = torch.randn(16, 4, generator=gen), torch.arange(16) % 2
        super().__init__((x, y), (x[:4], y[:4]), batch_size=4, **kwargs)
        self.script = list(zip(accuracy, val_loss))
        self.calls = 0

    def evaluate(self, model):
        scores = super().evaluate(model)
        if model is not None:
            scores["accuracy"], scores["val_loss"] = self.script[min(self.calls, len(self.script) - 1)]
            self.calls += 1
        return scores


def config(tmp_path, max_steps: int = 40, **train) -> ExperimentConfig:
    return ExperimentConfig(
        model=ModelConfig(name="model"),
        train=TrainConfig(max_steps=max_steps, eval_every=2, log_every=1000, out=str(tmp_path), **train),
    )


def run(tmp_path, task, **train):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    trainer = Trainer(config(tmp_path, **train), progress=False, model=model, task=task)
    summary = trainer.fit()
    return trainer, summary, json.loads((tmp_path / "metrics.json").read_text())


def test_patience_stops_after_that_many_evaluations_without_a_better_accuracy(tmp_path):
    # evaluations at steps 2, 4, 6, ...: best 0.5 at step 4, then three worse ones -> stop at step 10
    task = ScriptedTask([0.1, 0.5, 0.4, 0.5, 0.3, 0.9], [1.0] * 6)
    trainer, summary, metrics = run(tmp_path, task, patience=3)
    assert trainer.step == 10 and metrics["steps"] == 10
    assert metrics["stopped_early"] is True and summary["stopped_early"] is True
    assert metrics["best_step"] == 4
    assert metrics["monitor"] == {"metric": "accuracy", "mode": "max", "best": 0.5}
    assert metrics["patience"] == {"value": 3, "unit": "evaluation"}
    # best.safetensors: the model of step 4, beside last (step 10, the last weights)
    best, best_meta = load_checkpoint(tmp_path / "best.safetensors")
    last, last_meta = load_checkpoint(tmp_path / "last.safetensors")
    assert best_meta["step"] == 4 and last_meta["step"] == 10
    assert best_meta["metrics"]["accuracy"] == 0.5
    assert not any(k.startswith("optim.") for k in best)
    w_best, w_last = model_state(best)["weight"], model_state(last)["weight"]
    assert not torch.equal(w_best, w_last)
    assert torch.equal(w_last, trainer.model.weight.detach())


def test_without_patience_the_run_goes_on_and_still_keeps_the_best(tmp_path):
    task = ScriptedTask([0.1, 0.5, 0.4, 0.5, 0.3], [1.0] * 5)
    trainer, _, metrics = run(tmp_path, task)
    assert trainer.step == 40
    assert metrics["stopped_early"] is False and metrics["best_step"] == 4 and metrics["patience"] is None
    assert load_checkpoint(tmp_path / "best.safetensors")[1]["step"] == 4


def test_monitor_val_loss_is_minimised(tmp_path):
    # accuracy keeps rising (it would never stop), the loss is best at the 2nd evaluation (step 4)
    task = ScriptedTask([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [2.0, 1.0, 1.5, 1.2, 1.1, 0.1])
    trainer, _, metrics = run(tmp_path, task, patience=2, monitor="val_loss")
    assert trainer.step == 8 and metrics["best_step"] == 4 and metrics["stopped_early"] is True
    assert metrics["monitor"] == {"metric": "val_loss", "mode": "min", "best": 1.0}


def test_a_run_that_reaches_its_end_is_not_stopped_early(tmp_path):
    task = ScriptedTask([0.5, 0.4, 0.3], [1.0] * 3)
    trainer = Trainer(config(tmp_path, max_steps=6, patience=2), progress=False, model=nn.Linear(4, 2), task=task)
    summary = trainer.fit()
    assert trainer.step == 6 and summary["stopped_early"] is False and summary["best_step"] == 2


def test_resumed_run_remembers_the_best_and_the_count(tmp_path):
    script = ([0.1, 0.5, 0.4, 0.4, 0.3, 0.9], [1.0] * 6)
    whole = run(tmp_path / "whole", ScriptedTask(*script), patience=3)[0]
    torch.manual_seed(0)
    first = Trainer(
        config(tmp_path / "split", patience=3), progress=False, model=nn.Linear(4, 2), task=ScriptedTask(*script)
    )
    first.start(max_steps=6)  # evaluations at 2 (0.1), 4 (0.5, best), 6 (0.4)
    first.train_for(float("inf"))
    first.save()
    task = ScriptedTask(*script)
    task.calls = 3
    second = Trainer(config(tmp_path / "split", patience=3), progress=False, model=nn.Linear(4, 2), task=task)
    assert second.resume()
    summary = second.fit()
    assert second.step == whole.step == 10
    assert summary["best_step"] == 4 and summary["stopped_early"] is True


def test_unknown_monitor_lists_the_task_metrics(tmp_path):
    task = ScriptedTask([0.5], [1.0])
    with pytest.raises(ConfigError, match=r"train.monitor 'val_acc' .*valid: accuracy, val_loss"):
        run(tmp_path, task, patience=2, monitor="val_acc")


def test_patience_needs_periodic_evaluations():
    with pytest.raises(ConfigError, match=r"train\.patience counts evaluations"):
        from_dict(ExperimentConfig, {"train": {"patience": 5, "eval_every": 0}})
    with pytest.raises(ConfigError, match=r"train\.patience: expected a value >= 1"):
        from_dict(ExperimentConfig, {"train": {"patience": 0}})
    cfg = from_dict(ExperimentConfig, {"train": {"patience": 5, "monitor": "val_loss"}})
    assert cfg.train.patience == 5 and cfg.train.monitor == "val_loss"
