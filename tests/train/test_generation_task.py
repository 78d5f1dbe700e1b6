"""QM9 generation through the engine and the CLI (``data.name: qm9_generation``, ``eqvit sample``), on a few
generated molecules in the original .xyz format (so qm9pack is not needed), with the tiny denoiser."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch
from helpers import write_xyz

import eqvit
from eqvit.cli import main
from eqvit.train.config import (
    ConfigError,
    DataConfig,
    DiffusionConfig,
    ExperimentConfig,
    ModelConfig,
    TrainConfig,
    load_config,
)
from eqvit.train.engine import Trainer, train
from eqvit.train.generation import QM9GenerationTask

HAS_GEN = all(importlib.util.find_spec(p) is not None for p in ("rdkit", "posebusters"))


@pytest.fixture
def xyz(tmp_path):
    write_xyz(tmp_path / "xyz", 60, min_atoms=3, max_atoms=5)
    return tmp_path


def _config(root, steps: int = 6, **diffusion) -> ExperimentConfig:
    return ExperimentConfig(
        model=ModelConfig(name="dip_qm9_tiny"),
        data=DataConfig(
            name="qm9_generation",
            root=str(root / "xyz"),
            cache_dir=str(root / "cache"),
            batch_size=4,
            val_batch_size=8,
            train_rotate="so3",
            diffusion=DiffusionConfig(steps=4, sample_batch=3, **diffusion),
        ),
        train=TrainConfig(max_steps=steps, eval_every=3, out=str(root / "run")),
    )


def test_batches_hold_one_atom_count_rotated_and_centred(xyz):
    cfg = _config(xyz)
    task = QM9GenerationTask(cfg.data, eqvit.create_model("dip_qm9_tiny"), torch.device("cpu"))
    counts = set()
    for _ in range(task.steps_per_epoch):
        (pos, feat, t), target = task.train_batch()
        assert pos.shape[:2] == feat.shape[:2] == target.shape[:2] and target.shape[-1] == 3 + 5 + 1
        assert pos.mean(1).abs().max() < 1e-5 and t.shape == (len(pos),) and ((t >= 0) & (t < 1)).all()
        counts.add(pos.shape[1])
    assert counts == {3, 4, 5}
    # the stream is a function of the step: restoring the position replays it
    task.load_data_state(torch.tensor([2]))
    first = task.train_batch()
    task.load_data_state(torch.tensor([2]))
    again = task.train_batch()
    assert all(torch.equal(a, b) for a, b in zip((*first[0], first[1]), (*again[0], again[1])))


def test_rotation_leaves_the_distances_of_the_clean_molecule(xyz):
    cfg = _config(xyz)
    task = QM9GenerationTask(cfg.data, eqvit.create_model("dip_qm9_tiny"), torch.device("cpu"))
    from eqvit.data.qm9_generation import random_rotations

    rows = np.flatnonzero(task.splits["train"].num_atoms == task.splits["train"].num_atoms[0])[:2]
    plain = task.state("train", rows)
    turned = task.state("train", rows, random_rotations("so3", 2, torch.Generator().manual_seed(0)))
    torch.testing.assert_close(
        torch.cdist(turned[..., :3], turned[..., :3]), torch.cdist(plain[..., :3], plain[..., :3])
    )
    assert not torch.allclose(turned[..., :3], plain[..., :3])
    torch.testing.assert_close(turned[..., 3:], plain[..., 3:])


def test_training_writes_checkpoints_and_resumes(xyz):
    cfg = _config(xyz, steps=6)
    summary = train(cfg, progress=False)
    assert summary["steps"] == 6 and np.isfinite(summary["val_loss"])
    assert summary["monitor"]["metric"] == "val_loss" and summary["best_step"] in (3, 6)
    run = xyz / "run"
    assert (run / "best.safetensors").is_file() and (run / "metrics.json").is_file()
    # an interrupted run resumed reproduces the uninterrupted one
    split = xyz / "split"
    train(_config(xyz, steps=6), out_dir=split, max_steps=3, progress=False)
    resumed = train(_config(xyz, steps=6), out_dir=split, resume=True, progress=False)
    assert resumed["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-6)


def test_early_stopping_and_sampled_stability_at_evaluation(xyz):
    cfg = _config(xyz, steps=30, eval_samples=4, eval_steps=2)
    cfg.train.patience = 1
    cfg.optim.lr = 0.5  # diverging steps: the validation loss stops improving
    trainer = Trainer(cfg, progress=False, write=False)
    summary = trainer.fit()
    assert summary["stopped_early"] and summary["steps"] < 30
    assert 0.0 <= summary["metrics"]["atom_stability"] <= 1.0 and "molecule_stability" in summary["metrics"]


def test_a_model_without_the_time_input_is_refused(xyz):
    cfg = _config(xyz)
    with pytest.raises(ValueError, match=r"t \[B\]\) \(dip_qm9_\*\); this model takes pos \[B, N, 3\], feat"):
        QM9GenerationTask(cfg.data, eqvit.create_model("platonic_qm9_tiny"), torch.device("cpu"))


def test_config_file_and_its_diffusion_section(tmp_path):
    cfg = load_config("configs/dip_qm9.yaml")
    assert cfg.data.name == "qm9_generation" and cfg.model.name.startswith("dip_qm9")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  name: qm9_generation\n  diffusion:\n    schedule: polynomal\n")
    with pytest.raises(ConfigError, match=r"data.diffusion.schedule.*Did you mean 'polynomial'"):
        load_config(bad)
    bad.write_text("data:\n  name: qm9_generation\n  diffusion:\n    step: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'step'; did you mean 'steps'"):
        load_config(bad)


@pytest.mark.skipif(not HAS_GEN, reason="needs the gen extra (rdkit, posebusters)")
def test_cli_trains_then_samples_and_scores(xyz, tmp_path, capsys):
    import yaml

    cfg = _config(xyz, steps=3).to_dict()
    path = tmp_path / "dip.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    out = tmp_path / "samples"
    checkpoint = str(xyz / "run" / "best.safetensors")
    assert main(["sample", str(path), "--checkpoint", checkpoint, "--num", "5", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("atom_stability", "molecule_stability", "validity", "uniqueness", "novelty", "pb_all"):
        assert key in metrics, key
    assert metrics["num"] == 5 and metrics["steps"] == 4 and metrics["sampler"] == "ancestral"
    assert len((out / "samples.xyz").read_text().split("sample ")) == 6
    assert (out / "samples.sdf").read_text().count("$$$$") == 5
    # a config of another task is refused in one paragraph
    other = tmp_path / "other.yaml"
    other.write_text("data:\n  name: qm9\n")
    capsys.readouterr()
    assert main(["sample", str(other), "--checkpoint", checkpoint, "--num", "2", "--out", str(out)]) == 2
    assert "data.name: qm9_generation" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_GEN, reason="needs the gen extra (rdkit, posebusters)")
def test_benchmark_at_ci_size_writes_a_row_per_model(xyz, tmp_path):
    import yaml

    from eqvit.bench import dip_qm9

    path = tmp_path / "dip.yaml"
    path.write_text(yaml.safe_dump(_config(xyz).to_dict()))
    out = tmp_path / "dip_qm9.json"
    args = ["--quick", "--config", str(path), "--runs", str(tmp_path / "runs"), "--out", str(out)]
    assert dip_qm9.main(args) == 0
    rows = json.loads(out.read_text())
    assert [r["frames"] for r in rows] == ["trivial", "T", dip_qm9.PUBLISHED_EDM["frames"]]
    for row in rows[:2]:
        for key in ("atom_stability", "molecule_stability", "validity", "uniqueness", "novelty", "pb_all"):
            assert 0.0 <= row[key] <= 1.0, key
        assert row["steps"] > 0 and row["params"] > 0 and row["wall_s"] > 0 and row["num_molecules"] == 4
    assert rows[0]["params"] > rows[1]["params"]  # T shares its weights over 12 frames at the same width
    assert (tmp_path / "dip_qm9_molecules.png").is_file() or rows[1]["num_valid"] == 0
