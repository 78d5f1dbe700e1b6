"""YAML configs validated against dataclasses; crash-safe safetensors checkpoints with a JSON sidecar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import ROOT
from safetensors.torch import load_file

import eqvit
from eqvit.train import checkpoint as ckpt_module
from eqvit.train.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    load_checkpoint,
    load_model_state,
    save_checkpoint,
)
from eqvit.train.config import ConfigError, ExperimentConfig, load_config

REPO = ROOT


def _yaml(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------------
# configs


def test_unknown_key_names_it_and_suggests_the_close_one(tmp_path):
    path = _yaml(tmp_path, "optim:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "'lrr'" in message and "'lr'" in message
    assert "optim" in message  # where it was found
    assert isinstance(info.value, ValueError)


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(ConfigError, match=r"'optimizer'.*'optim'"):
        load_config(_yaml(tmp_path, "optimizer:\n  lr: 0.1\n"))


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('train:\n  max_steps: "ten"\n', "train.max_steps"),
        ("train:\n  max_steps: 1.5\n", "train.max_steps"),
        ("train:\n  max_steps: true\n", "train.max_steps"),
        ("optim:\n  lr: fast\n", "optim.lr"),
        ("model:\n  kwargs: [1, 2]\n", "model.kwargs"),
        ("data: 3\n", "data"),
    ],
)
def test_wrong_type_names_the_field(tmp_path, text, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(_yaml(tmp_path, text))


def test_valid_values_are_converted(tmp_path):
    cfg = load_config(_yaml(tmp_path, "optim:\n  lr: 1\n  grad_clip: null\ntrain:\n  max_steps: 7\n"))
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.grad_clip is None
    assert cfg.train.max_steps == 7
    assert cfg.data == ExperimentConfig().data  # untouched sections keep their defaults


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="YAML"):
        load_config(_yaml(tmp_path, "optim: {lr: [\n"))


def test_demo_config_loads_and_names_a_registered_model():
    cfg = load_config(REPO / "configs" / "so3vit_swe_demo.yaml")
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.model.name == "so3vit_4x128"
    assert eqvit.models.is_model(cfg.model.name)
    assert cfg.model.kwargs["symmetry_breaking"] == "latitude"
    # The kwargs are accepted by the model (built on a small grid to stay cheap).
    kwargs = dict(cfg.model.kwargs, input_level=3, patch_level=1)
    model = eqvit.create_model(cfg.model.name, **kwargs)
    assert model.residual and model.group.order == 5
    assert json.loads(json.dumps(cfg.to_dict())) == cfg.to_dict()


# ------------------------------------------------------------------------------------------------
# checkpoints


@pytest.fixture(scope="module")
def trained():
    """A tiny SO3ViT after one optimiser step, so that Adam has tensor state."""
    torch.manual_seed(0)
    model = eqvit.create_model("so3vit_tiny")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(1, 3, 642)
    model(x).square().mean().add(model.tokenizer.proj.weight.square().sum()).backward()
    optimizer.step()
    return model, optimizer


def test_round_trip(tmp_path, trained):
    model, optimizer = trained
    config = {"model": {"name": "so3vit_tiny", "kwargs": {}}, "optim": {"lr": 0.01}}
    weights = save_checkpoint(tmp_path, model, step=7, config=config, metrics={"loss": 0.5}, optimizer=optimizer)
    assert weights == tmp_path / "last.safetensors"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.json", "last.safetensors"]

    tensors, sidecar = load_checkpoint(weights)
    assert sidecar["step"] == 7 and sidecar["config"] == config and sidecar["metrics"] == {"loss": 0.5}
    assert sidecar["weights"] == "last.safetensors"
    assert json.loads((tmp_path / "last.json").read_text()) == sidecar
    assert any(k.startswith("optim.") for k in tensors)  # Adam's exp_avg etc.

    torch.manual_seed(1)
    fresh = eqvit.create_model("so3vit_tiny")
    assert any(not torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    load_model_state(fresh, tensors)
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k
    # The sidecar path finds the weights beside it.
    tensors_from_json, _ = load_checkpoint(tmp_path / "last.json")
    assert tensors_from_json.keys() == tensors.keys()


def test_load_model_state_rejects_other_model(tmp_path, trained):
    model, _ = trained
    save_checkpoint(tmp_path, model, step=1, config={})
    tensors, _ = load_checkpoint(tmp_path / "last.safetensors")
    other = eqvit.create_model("so3vit_tiny", depth=1)
    with pytest.raises(CheckpointError, match="does not fit"):
        load_model_state(other, tensors)


def test_truncated_checkpoint_names_the_file(tmp_path, trained):
    model, _ = trained
    weights = save_checkpoint(tmp_path, model, step=3, config={}, name="run42")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(weights)
    assert "run42.safetensors" in str(info.value)
    weights.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"run42\.safetensors"):
        load_checkpoint(weights)


def test_missing_checkpoint_and_sidecar_copy(tmp_path, trained):
    with pytest.raises(CheckpointError, match=r"nothing\.safetensors"):
        load_checkpoint(tmp_path / "nothing.safetensors")
    model, _ = trained
    save_checkpoint(tmp_path, model, step=3, config={})
    # The sidecar inside the safetensors metadata is authoritative; last.json is a readable copy,
    # so a crash (or damage) after the weights were renamed cannot desynchronise the two.
    (tmp_path / "last.json").write_text("{truncated")
    _, sidecar = load_checkpoint(tmp_path / "last.safetensors")
    assert sidecar["step"] == 3


def test_atomic_write_leaves_no_temp_files(tmp_path, trained):
    model, optimizer = trained
    for step in range(3):  # overwriting an existing checkpoint too
        save_checkpoint(tmp_path, model, step=step, config={}, optimizer=optimizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.json", "last.safetensors"]
    assert json.loads((tmp_path / "last.json").read_text())["step"] == 2


def test_failed_write_keeps_previous_checkpoint(tmp_path, trained, monkeypatch):
    """A crash while writing leaves the previous checkpoint intact and no temp file behind."""
    model, _ = trained
    save_checkpoint(tmp_path, model, step=1, config={"a": 1})
    before = (tmp_path / "last.safetensors").read_bytes()

    def crashing_save_file(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_module, "save_file", crashing_save_file)
    with pytest.raises(CheckpointWriteError, match=r"disk full.*previous checkpoint there is kept"):
        save_checkpoint(tmp_path, model, step=2, config={"a": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.json", "last.safetensors"]
    assert (tmp_path / "last.safetensors").read_bytes() == before
    assert json.loads((tmp_path / "last.json").read_text())["step"] == 1
    assert load_file(str(tmp_path / "last.safetensors")).keys()
