"""The QM9 regression task through the engine and the CLI, and the QM9 benchmark at CI size, on a
few generated molecules in the original .xyz format (so qm9pack is not needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import write_xyz

import eqvit
from eqvit.cli import main
from eqvit.data import qm9
from eqvit.train.config import ConfigError, DataConfig, ExperimentConfig, ModelConfig, TrainConfig, load_config
from eqvit.train.engine import Trainer
from eqvit.train.regression import HARTREE_MEV, QM9Task, same_count_batches


def _config(tmp_path, targets=("gap", "u0", "mu"), **data):
    return ExperimentConfig(
        model=ModelConfig(name="platonic_qm9_tiny", kwargs={"num_targets": len(targets)}),
        data=DataConfig(
            name="qm9",
            targets=list(targets),
            root=str(tmp_path / "xyz"),
            cache_dir=str(tmp_path / "cache"),
            batch_size=4,
            val_batch_size=8,
            **data,
        ),
        train=TrainConfig(max_steps=6, eval_every=3, out=str(tmp_path / "run")),
    )


@pytest.fixture
def xyz(tmp_path):
    write_xyz(tmp_path / "xyz", 60, min_atoms=3, max_atoms=5)
    return tmp_path


def test_buckets_cover_every_molecule_once_with_one_count_each():
    counts = np.array([3, 4, 3, 5, 4, 3, 3, 5, 4])
    for rng in (None, np.random.default_rng(0)):
        batches = same_count_batches(counts, 2, rng)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(counts)))
        assert all(len(set(counts[b].tolist())) == 1 and len(b) <= 2 for b in batches)


def test_scores_are_in_the_fields_units(xyz):
    cfg = _config(xyz)
    model = eqvit.create_model("platonic_qm9_tiny", num_targets=3)
    task = QM9Task(cfg.data, model, torch.device("cpu"))
    base = task.evaluate(None)
    truth = task.splits["val"].targets[:, [qm9.TARGET_NAMES.index(t) for t in ("gap", "u0", "mu")]]
    pred = task.norm.reference(task.counts["val"])
    assert base["mae_gap"] == pytest.approx(np.abs(pred[:, 0] - truth[:, 0]).mean() * HARTREE_MEV)
    assert base["mae_u0"] == pytest.approx(np.abs(pred[:, 1] - truth[:, 1]).mean() * 27_211.386)
    assert base["mae_mu"] == pytest.approx(np.abs(pred[:, 2] - truth[:, 2]).mean())  # Debye as they are
    # the normalisation: training targets have mean 0 and std 1 once encoded
    z = task.z["train"]
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(z.std(0), 1, atol=1e-12)
    (pos, atoms), target = task.train_batch()
    assert pos.shape[:2] == atoms.shape[:2] and atoms.shape[-1] == 5 and target.shape == (len(pos), 3)


def test_training_writes_val_and_test_mae(xyz):
    summary = Trainer(_config(xyz), progress=False).fit()
    metrics = json.loads((xyz / "run" / "metrics.json").read_text())
    for key in ("val_mae", "test_mae"):
        assert set(metrics[key]) == {"gap", "u0", "mu"} and all(np.isfinite(v) for v in metrics[key].values())
    assert metrics["units"] == {"gap": "meV", "u0": "meV", "mu": "D"}
    assert metrics["test_molecules"] == qm9.split_sizes(60)["test"] == summary["test_molecules"]
    assert (xyz / "run" / "parity.png").is_file() and (xyz / "run" / "loss_curve.png").is_file()


def test_resume_restores_the_data_stream(xyz):
    cfg = _config(xyz, targets=("gap",))
    cfg.model.kwargs = {"num_targets": 1}
    a = Trainer(cfg, progress=False, write=False)
    first = [a.task.train_batch()[1] for _ in range(5)]
    b = Trainer(cfg, progress=False, write=False)
    b.task.load_data_state(torch.tensor([3]))
    torch.testing.assert_close(b.task.train_batch()[1], first[3])


def test_user_errors(xyz):
    cfg = _config(xyz, targets=("gap", "nope"))
    with pytest.raises(ValueError, match="unknown QM9 target 'nope'"):
        Trainer(cfg, progress=False, write=False)
    cfg = _config(xyz, targets=("gap",))
    cfg.model.kwargs = {"num_targets": 2}
    with pytest.raises(ValueError, match="num_targets: 1"):
        Trainer(cfg, progress=False, write=False)
    cfg.model = ModelConfig(name="platonic_points_tiny")
    with pytest.raises(ValueError, match="platonic_qm9"):
        Trainer(cfg, progress=False, write=False)
    with pytest.raises(ConfigError, match=r"data\.targets"):
        DataConfig(name="qm9", targets="gap")


def test_cli_without_qm9pack_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path / "cache"))

    def missing():
        raise ModuleNotFoundError("QM9 needs the package qm9pack: pip install 'eqvit[qm9]'")

    monkeypatch.setattr(qm9, "qm9pack_files", missing)
    code = main(["train", "configs/platonic_qm9.yaml", "--out", str(tmp_path / "run"), "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'eqvit[qm9]'" in err and "Traceback" not in err


def test_config_file_is_valid():
    cfg = load_config("configs/platonic_qm9.yaml")
    assert cfg.data.name == "qm9" and cfg.data.targets == ["gap"]
    assert eqvit.create_model(cfg.model.name, **cfg.model.kwargs).out_chans == 1


def test_benchmark_quick(xyz, capsys):
    from eqvit.bench.qm9 import main as bench

    out = xyz / "results" / "qm9.json"
    args = ["--quick", "--root", str(xyz / "xyz"), "--cache-dir", str(xyz / "cache"), "--out", str(out)]
    assert bench([*args, "--models", "plain", "T", "--minutes", "0.01", "--width", "48", "--depth", "1"]) == 0
    result = json.loads(out.read_text())
    assert [r["model"] for r in result["records"]] == ["plain", "T"]
    assert all(r["steps"] > 0 and np.isfinite(r["test_mae"]["gap"]) for r in result["records"])
    assert result["layout"]["bucketed_step_s"] > 0 and (xyz / "results" / "qm9_curves.png").is_file()
    text = capsys.readouterr().out
    assert "EGNN" in text and "NOT comparable" in text
