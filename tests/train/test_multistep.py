"""Multi-step training (eqvit.train.multistep): the K-step loss, its gradients, the curriculum, the config.

The loss math is checked on a toy linear model; the data, the K = 1 identity and the Trainer on the
tiny SO3ViT (642 vertices) with two validation simulations.
"""

from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

from eqvit.train.config import ConfigError, TrainConfig, load_config
from eqvit.train.multistep import rollout_events, rollout_steps_at, unrolled_loss

TINY = {
    "model": {"name": "so3vit_tiny", "kwargs": {"residual": True, "symmetry_breaking": "latitude"}},
    "data": {"batch_size": 2, "num_val": 2, "val_batch_size": 2},
    "train": {"max_steps": 3, "eval_every": 0, "log_every": 1, "threads": 1},
}


def _write(tmp_path, **train) -> str:
    cfg = {**TINY, "train": {**TINY["train"], **train}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path / "cache"))


class _MSE:
    """A task's loss: plain mean squared error."""

    @staticmethod
    def loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (pred - target).pow(2).mean()


def _toy() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(5, 5)
    return model, torch.randn(4, 3, 5), torch.randn(3, 4, 3, 5)


# ---------------------------------------------------------------------------------- the loss


def test_one_step_is_the_task_loss_and_k_steps_average_the_unroll():
    model, x, targets = _toy()
    torch.testing.assert_close(unrolled_loss(model, _MSE, x, targets[:1]), _MSE.loss(model(x), targets[0]))
    p1 = model(x)
    p2 = model(p1)
    p3 = model(p2)
    by_hand = (_MSE.loss(p1, targets[0]) + _MSE.loss(p2, targets[1]) + _MSE.loss(p3, targets[2])) / 3
    torch.testing.assert_close(unrolled_loss(model, _MSE, x, targets), by_hand)


def test_gradients_flow_through_the_unroll():
    """The step-2 term's gradient includes the path through the first application: detaching the
    intermediate prediction changes the gradient."""
    model, x, targets = _toy()
    unrolled_loss(model, _MSE, x, targets[:2]).backward()
    through = model.weight.grad.clone()
    model.zero_grad()
    p1 = model(x)
    ((_MSE.loss(p1, targets[0]) + _MSE.loss(model(p1.detach()), targets[1])) / 2).backward()
    assert (through - model.weight.grad).abs().max() > 1e-4
    # and the gradient is that of the by-hand unroll
    model.zero_grad()
    p1 = model(x)
    ((_MSE.loss(p1, targets[0]) + _MSE.loss(model(p1), targets[1])) / 2).backward()
    torch.testing.assert_close(through, model.weight.grad)


def test_discount_weights_step_k_by_gamma_to_the_k_minus_one():
    model, x, targets = _toy()
    p1 = model(x)
    p2 = model(p1)
    p3 = model(p2)
    by_hand = (_MSE.loss(p1, targets[0]) + 0.5 * _MSE.loss(p2, targets[1]) + 0.25 * _MSE.loss(p3, targets[2])) / 1.75
    torch.testing.assert_close(unrolled_loss(model, _MSE, x, targets, discount=0.5), by_hand)
    # a discount of one is the plain mean, and one step ignores the discount
    torch.testing.assert_close(unrolled_loss(model, _MSE, x, targets, 1.0), unrolled_loss(model, _MSE, x, targets))
    torch.testing.assert_close(unrolled_loss(model, _MSE, x, targets[:1], 0.3), _MSE.loss(p1, targets[0]))
    with pytest.raises(ValueError, match=r"expected a discount > 0, got -1"):
        unrolled_loss(model, _MSE, x, targets, -1)


def test_targets_of_the_wrong_shape_are_refused():
    model, x, targets = _toy()
    with pytest.raises(ValueError, match=r"expected targets of shape \[K, 4, 3, 5\].*got \[4, 3, 5\]"):
        unrolled_loss(model, _MSE, x, targets[0])


# ---------------------------------------------------------------------------------- the curriculum


def test_curriculum_gives_the_documented_k_per_step():
    cfg = TrainConfig(rollout_steps=1, rollout_schedule={3: 2, 5: 4})
    assert [rollout_steps_at(cfg, s) for s in range(7)] == [1, 1, 1, 2, 2, 4, 4]
    cfg = TrainConfig(rollout_steps=2, rollout_schedule={4: 3, 0: 2})
    assert [rollout_steps_at(cfg, s) for s in range(6)] == [2, 2, 2, 2, 3, 3]
    assert [rollout_steps_at(TrainConfig(rollout_steps=3), s) for s in (0, 100)] == [3, 3]
    assert rollout_events(TrainConfig(rollout_schedule={0: 1, 3: 2, 5: 4}), last_step=4) == [(3, "K=2")]


@pytest.mark.parametrize(
    ("train", "match"),
    [
        ({"rollout_step": 2}, r"unknown key 'rollout_step'; did you mean 'rollout_steps'"),
        ({"rollout_steps": 0}, r"train.rollout_steps: expected a value >= 1, got 0"),
        ({"rollout_steps": 1.5}, r"train.rollout_steps: expected an integer, got float 1.5"),
        ({"rollout_schedule": {-1: 2}}, r"train.rollout_schedule key -1 .*expected a value >= 0, got -1"),
        ({"rollout_schedule": {10: 0}}, r"train.rollout_schedule.10 \(rollout steps K\): expected a value >= 1"),
        ({"rollout_schedule": {10: "two"}}, r"train.rollout_schedule.10: expected an integer, got str 'two'"),
        ({"rollout_schedule": [2, 4]}, r"train.rollout_schedule: expected a mapping, got list"),
        ({"grad_checkpointing": "yes"}, r"train.grad_checkpointing: expected bool, got str 'yes'"),
        ({"rollout_discount": 0}, r"train.rollout_discount: expected a value > 0, got 0"),
    ],
)
def test_bad_multistep_config_is_a_value_error_naming_the_key(tmp_path, train, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_config(_write(tmp_path, **train))
    assert isinstance(err.value, ValueError)


# ---------------------------------------------------------------------------------- data and trainer


def test_rollout_batch_is_the_stream_pair_then_the_solver(cache):
    from eqvit.data.shallow_water import ShallowWaterConfig, ShallowWaterData
    from eqvit.geometry import icosphere

    points = torch.tensor(icosphere(2).vertices)
    a = ShallowWaterData(ShallowWaterConfig(seed=3), points=points)
    b = ShallowWaterData(ShallowWaterConfig(seed=3), points=points)
    x, y = a.next_batch(2)
    state = b.generator.get_state()
    x3, targets = b.next_rollout_batch(2, 3)
    assert targets.shape == (3, *x.shape)
    torch.testing.assert_close(x3, x)
    torch.testing.assert_close(targets[0], y)
    b.generator.set_state(state)
    spec_x, _ = b.next_spectral_pairs(2)
    for k in range(3):
        torch.testing.assert_close(targets[k], b.fields(b.step(spec_x, k + 1), "points"))
    with pytest.raises(ValueError, match="expected num_steps to be an integer >= 1, got 0"):
        b.next_rollout_batch(2, 0)


def test_k1_equals_one_step_training_on_the_tiny_so3vit(tmp_path, cache):
    from eqvit.train.engine import Trainer

    trainer = Trainer(load_config(_write(tmp_path)), out_dir=tmp_path / "run", progress=False, write=False)
    task, model = trainer.task, trainer.model
    state = task.data_state()
    x, y = task.train_batch()
    task.load_data_state(state)
    x1, targets = task.train_rollout_batch(1)
    torch.testing.assert_close(x1, x)
    torch.testing.assert_close(unrolled_loss(model, task, x1, targets), task.loss(model(x), y))


def test_grad_checkpointing_gives_the_same_k_step_gradients(tmp_path, cache):
    from eqvit.train.engine import Trainer

    trainer = Trainer(load_config(_write(tmp_path)), out_dir=tmp_path / "run", progress=False, write=False)
    task, model = trainer.task, trainer.model
    x, targets = task.train_rollout_batch(3)
    grads = []
    for enable in (False, True):
        model.set_grad_checkpointing(enable)
        model.zero_grad()
        unrolled_loss(model, task, x, targets).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_trainer_follows_the_curriculum(tmp_path, cache, monkeypatch):
    from eqvit.train.engine import Trainer

    path = _write(tmp_path, max_steps=4, rollout_schedule={1: 2, 3: 3}, grad_checkpointing=True)
    trainer = Trainer(load_config(path), out_dir=tmp_path / "run", progress=False)
    assert trainer.model.grad_checkpointing
    drawn = []
    one_step, k_step = trainer.task.train_batch, trainer.task.train_rollout_batch
    monkeypatch.setattr(trainer.task, "train_batch", lambda: (drawn.append(1), one_step())[1])
    monkeypatch.setattr(trainer.task, "train_rollout_batch", lambda k: (drawn.append(k), k_step(k))[1])
    summary = trainer.fit()
    assert drawn == [1, 2, 2, 3]
    assert summary["steps"] == 4 and all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.history.train)
    assert (tmp_path / "run" / "loss_curve.png").is_file()


def test_multistep_needs_a_task_with_k_step_targets(tmp_path, cache):
    from eqvit.train.engine import Trainer
    from eqvit.train.tasks import TensorClassificationTask

    config = load_config(_write(tmp_path, rollout_steps=2))
    data = (torch.randn(8, 3), torch.randint(0, 2, (8,)))
    task = TensorClassificationTask(data, data, batch_size=4, num_classes=2)
    with pytest.raises(ValueError, match=r"K = 2 need a task whose model predicts its own next input"):
        Trainer(config, model=nn.Linear(3, 2), task=task, progress=False, write=False)
    config = load_config(_write(tmp_path, grad_checkpointing=True))
    with pytest.raises(ValueError, match=r"train.grad_checkpointing needs a model with set_grad_checkpointing"):
        Trainer(config, model=nn.Linear(3, 2), task=task, progress=False, write=False)


def test_trainer_passes_the_discount_to_the_unrolled_loss(tmp_path, cache, monkeypatch):
    import eqvit.train.engine as engine

    seen = []

    def recording(network, task, x, targets, discount=1.0):
        seen.append((len(targets), discount))
        return unrolled_loss(network, task, x, targets, discount)

    monkeypatch.setattr(engine, "unrolled_loss", recording)
    path = _write(tmp_path, max_steps=2, rollout_steps=2, rollout_discount=0.5)
    engine.Trainer(load_config(path), out_dir=tmp_path / "run", progress=False, write=False).fit()
    assert seen == [(2, 0.5), (2, 0.5)]
