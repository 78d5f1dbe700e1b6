"""Image classification through the engine: ``eqvit train`` on rotated MNIST / image folders.

The tiny runs use ``o2vit_square_tiny`` on 32x32 digits (8x8 patches, 16 tokens) for a few steps.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import ROOT, TINY_MNIST_RUN, mnist_config, write_yaml
from torch import nn

from eqvit.train.config import ConfigError, load_config


def test_tiny_rotated_mnist_trains_writes_reports_and_evaluates(tmp_path, capsys):
    from eqvit.cli import main
    from eqvit.train.engine import evaluate_checkpoint, train

    path = write_yaml(tmp_path, TINY_MNIST_RUN)
    out = tmp_path / "run"
    summary = train(load_config(path), out_dir=out, progress=False)
    # 80 digits (2% of 4,000) in batches of 16: 5 steps per epoch, 2 epochs
    assert summary["steps"] == 10 and summary["epochs"] == 2.0
    assert summary["dataset"] == "rotated_mnist" and summary["group"] == "D4"
    for name in ("last.safetensors", "last.json", "metrics.json", "history.csv", "evals.json"):
        assert (out / name).is_file(), name
    for name in ("loss_curve.png", "confusion.png"):
        assert (out / name).stat().st_size > 1000, name
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= metrics["metrics"]["accuracy"] <= 1.0
    assert len(metrics["metrics"]["per_class_accuracy"]) == 10
    assert metrics["majority_class"]["accuracy"] == pytest.approx(0.1, abs=0.05)  # ~balanced digits
    assert [row["step"] for row in json.loads((out / "evals.json").read_text())] == [5, 10]
    # the checkpoint scores the same as the end of training
    result = evaluate_checkpoint(load_config(path), out / "last.safetensors", progress=False)
    assert result["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"])
    report = tmp_path / "eval.json"
    assert main(["eval", str(path), "--checkpoint", str(out / "last.safetensors"), "--json", str(report)]) == 0
    assert "accuracy" in capsys.readouterr().out
    assert json.loads(report.read_text())["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"])


@pytest.mark.parametrize("img_size", [32, None])
def test_hexagonal_model_gets_digits_resampled_onto_its_grid(tmp_path, img_size):
    """A hexagonal model on square images resamples them itself; one built on its grid (img_size=None) gets
    the digits resampled by the data."""
    from eqvit.train.engine import Trainer

    cfg = mnist_config(
        model={"name": "o2vit_hex_tiny", "kwargs": {"in_chans": 1, "num_classes": 10, "img_size": img_size}},
        data={"img_size": 32},
        train={"max_epochs": 0.4},
    )
    trainer = Trainer(load_config(write_yaml(tmp_path, cfg)), tmp_path / "hex", progress=False)
    (x,), y = trainer.task.train_batch()
    grid = (32, 32) if img_size else (trainer.model.domain.points.shape[0],)
    assert x.shape == (16, 1, *grid) and y.shape == (16,)
    summary = trainer.fit()
    assert summary["steps"] == 2 and summary["group"] == ("D2" if img_size else "D6")


def test_relaxation_restricts_at_the_step_and_resume_rebuilds_it(tmp_path):
    from eqvit.train.checkpoint import load_checkpoint
    from eqvit.train.engine import evaluate_checkpoint, train

    cfg = mnist_config(train={"max_epochs": 1.6, "eval_every_epochs": None, "eval_every": 0})
    cfg["model"]["relaxation"] = {"unit": "step", "schedule": {3: "D2", 6: "C2"}}
    path = write_yaml(tmp_path, cfg)
    full = train(load_config(path), out_dir=tmp_path / "full", progress=False)
    assert full["steps"] == 8 and full["relaxed"] == ["D2", "C2"] and full["group"] == "C2"
    train(load_config(path), out_dir=tmp_path / "split", max_steps=4, progress=False)
    assert load_checkpoint(tmp_path / "split" / "last.safetensors")[1]["relaxed"] == ["D2"]
    split = train(load_config(path), out_dir=tmp_path / "split", resume=True, progress=False)
    assert split["relaxed"] == ["D2", "C2"]
    a = [r["loss"] for r in json.loads((tmp_path / "full" / "last.json").read_text())["history"]["train"]]
    b = [r["loss"] for r in json.loads((tmp_path / "split" / "last.json").read_text())["history"]["train"]]
    assert np.allclose(a, b, rtol=1e-5, atol=1e-7), (a, b)
    result = evaluate_checkpoint(load_config(path), tmp_path / "full" / "last.safetensors", progress=False)
    assert result["metrics"]["accuracy"] == pytest.approx(full["metrics"]["accuracy"])


def test_relaxation_epochs_convert_to_steps():
    from eqvit.train.config import ExperimentConfig, RelaxationConfig
    from eqvit.train.engine import relaxation_steps

    cfg = ExperimentConfig()
    cfg.model.relaxation = RelaxationConfig(unit="epoch", schedule={4: "C1", 2: "D2"})
    assert relaxation_steps(cfg, steps_per_epoch=7) == [(14, "D2"), (28, "C1")]
    with pytest.raises(ValueError, match="unit: step"):
        relaxation_steps(cfg, steps_per_epoch=None)


def test_image_folder_dataset_trains(tmp_path):
    from PIL import Image

    from eqvit.train.engine import train

    rng = np.random.default_rng(0)
    for c in ("forest", "harbor", "runway"):
        (tmp_path / "images" / c).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(
                tmp_path / "images" / c / f"{i}.png"
            )
    cfg = mnist_config(
        model={"name": "o2vit_square_tiny", "kwargs": {"in_chans": 3, "num_classes": 3}},
        data={"name": "patternnet", "root": str(tmp_path / "images"), "batch_size": 4, "val_batch_size": 2},
        train={"max_epochs": 1},
    )
    cfg["data"].pop("sample_ratio")
    summary = train(load_config(write_yaml(tmp_path, cfg)), out_dir=tmp_path / "run", progress=False)
    assert summary["steps"] == 3  # 4 training images per class (80 %), batches of 4
    assert len(summary["metrics"]["per_class_accuracy"]) == 3


def _task_for(tmp_path, data: dict, model: str = "o2vit_square_tiny", **kwargs):
    import eqvit
    from eqvit.train.tasks import build_task

    cfg = load_config(write_yaml(tmp_path, {"data": data}))
    return build_task(cfg.data, eqvit.create_model(model, **kwargs), torch.device("cpu"))


def test_unknown_dataset_name_suggests_the_close_one(tmp_path, capsys):
    from eqvit.cli import main

    with pytest.raises(ValueError, match=r"unknown dataset \(data.name\) 'rotated_mnsit'.*'rotated_mnist'"):
        _task_for(tmp_path, {"name": "rotated_mnsit"})
    path = write_yaml(tmp_path, mnist_config(data={"name": "patternet"}), "typo.yaml")
    assert main(["train", str(path), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "'patternet'" in err and "Did you mean 'patternnet'" in err and "shallow_water" in err


def test_image_folder_root_missing_or_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match=r"data\.root is required"):
        _task_for(tmp_path, {"name": "patternnet"})
    with pytest.raises(ValueError, match=r"data\.root '.*nowhere' is not an existing folder"):
        _task_for(tmp_path, {"name": "patternnet", "root": str(tmp_path / "nowhere")})
    # the shipped config points at a folder that this checkout does not have
    shipped = load_config(ROOT / "configs" / "o2vit_patternnet.yaml")
    if not (ROOT / shipped.data.root).is_dir():
        from eqvit.train.tasks import build_task

        with pytest.raises(ValueError, match=r"data\.root 'data/PatternNet/images'"):
            build_task(shipped.data, nn.Identity(), torch.device("cpu"))


def test_model_and_dataset_must_agree(tmp_path):
    with pytest.raises(ValueError, match=r"5 outputs.*10 classes.*num_classes: 10"):
        _task_for(tmp_path, {"name": "rotated_mnist", "sample_ratio": 0.01}, img_size=32, patch_size=8)
    with pytest.raises(ValueError, match=r"data\.img_size 28 does not match"):
        _task_for(tmp_path, {"name": "rotated_mnist", "img_size": 28}, img_size=32, patch_size=8, num_classes=10)


@pytest.mark.parametrize(
    ("section", "text", "pattern"),
    [
        ("data", "sample_ration: 0.1", r"data.*'sample_ration'.*'sample_ratio'"),
        ("train", "max_epoch: 3", r"train.*'max_epoch'.*'max_epochs'"),
        ("model", "relaxation: {unit: epoch, schedul: {1: D2}}", r"'schedul'.*'schedule'"),
        ("model", "relaxation: {unit: epochs}", r"relaxation\.unit.*'epochs'"),
        ("model", "relaxation: {schedule: {one: D2}}", r"schedule key 'one'.*integer"),
        ("model", "relaxation: {schedule: {1: 2}}", r"schedule\.1.*expected str"),
        ("optim", "name: sgd", r"optim\.name.*'sgd'"),
        ("data", "root: [a, b]", r"data\.root"),
    ],
)
def test_config_keys_and_values_are_validated(tmp_path, section, text, pattern):
    path = tmp_path / "bad.yaml"
    path.write_text(
        f"data: {{name: rotated_mnist}}\n{section}:\n  {text}\n" if section != "data" else f"data:\n  {text}\n"
    )
    with pytest.raises(ConfigError, match=pattern):
        load_config(path)


def test_relaxation_needs_an_o2vit_and_a_chain_of_subgroups(tmp_path):
    import eqvit
    from eqvit.train.engine import check_relaxation

    with pytest.raises(ValueError, match=r"model\.relaxation.*unknown subgroup of C4 'D2'"):
        check_relaxation(eqvit.create_model("o2vit_square_tiny"), {1: "C4", 2: "D2"})
    with pytest.raises(ValueError, match="O\\(2\\)-subgroup ViT"):
        check_relaxation(nn.Linear(2, 2), {1: "C1"})
    check_relaxation(eqvit.create_model("o2vit_square_tiny"), {1: "D2", 2: "D1", 3: "C1"})


class PairModel(nn.Module):
    """Called as ``model(pos, feat)``, like the point-cloud models."""

    out_chans = 3

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, pos: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([pos.norm(dim=-1).mean(-1, keepdim=True), feat.mean(1)], -1))


def test_a_registered_dataset_can_feed_models_several_inputs(tmp_path, monkeypatch):
    """A dataset registered by name whose batches are ``((pos, feat), label)``."""
    from eqvit.train import engine, tasks

    def pairs(cfg, model):
        gen = torch.Generator().manual_seed(cfg.seed)
        pos, feat = torch.randn(30, 5, 3, generator=gen), torch.randn(30, 5, 3, generator=gen)
        labels = torch.arange(30) % 3
        split = lambda s: tasks.TensorSplit((pos[s], feat[s]), labels[s])  # noqa: E731
        return tasks.ClassificationData(split(slice(0, 24)), split(slice(24, 30)), ["a", "b", "c"])

    monkeypatch.setitem(tasks.CLASSIFICATION_DATASETS, "toy_pairs", pairs)
    monkeypatch.setattr(engine, "create_model", lambda name, **kwargs: PairModel())
    cfg = mnist_config(model={"name": "pair_model", "kwargs": {}}, data={"name": "toy_pairs", "batch_size": 8})
    summary = engine.train(load_config(write_yaml(tmp_path, cfg)), out_dir=tmp_path / "run", progress=False)
    assert summary["steps"] == 6 and summary["epochs"] == 2.0
    assert "toy_pairs" in tasks.dataset_names()


def test_shipped_configs_load_and_name_registered_models_and_datasets():
    import eqvit
    from eqvit.train.tasks import dataset_names

    for name in (
        "o2vit_rotmnist",
        "o2vit_hex_rotmnist",
        "o2vit_patternnet",
        "o2vit_hex_patternnet",
        "platonic_pointcloud",
    ):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        assert eqvit.models.is_model(cfg.model.name), name
        assert cfg.data.name in dataset_names(), name
        assert cfg.optim.name == "adamw" and cfg.train.max_epochs is not None


def test_platonic_point_cloud_model_trains_on_synthetic_shapes(tmp_path):
    """``data.name: synthetic_pointclouds`` feeds ``model(pos, feat)``; validation is SO(3)-rotated."""
    from eqvit.train.engine import train

    cfg = load_config(ROOT / "configs" / "platonic_pointcloud.yaml")
    cfg.model.name, cfg.model.kwargs = "platonic_points_tiny", {"group": "T", "num_classes": 10, "depth": 1}
    cfg.data.num_points, cfg.data.num_train, cfg.data.num_val = 16, 40, 20
    cfg.data.batch_size, cfg.train.max_epochs, cfg.train.eval_every_epochs = 10, 2, 1
    summary = train(cfg, out_dir=tmp_path / "run", progress=False)
    assert summary["steps"] == 8 and summary["group"] == "T"
    assert 0.0 <= summary["metrics"]["accuracy"] <= 1.0
    assert (tmp_path / "run" / "last.safetensors").is_file()
