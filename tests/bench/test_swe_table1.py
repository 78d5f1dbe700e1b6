"""The seed's Table 1 benchmark (eqvit.bench.swe_table1): its configs encode the seed's protocol, and
the driver writes one JSON row per model with the seed's figures beside ours."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from eqvit.bench import swe_table1
from eqvit.bench._paths import config_path
from eqvit.train.config import load_config


@pytest.mark.parametrize("row", list(swe_table1.CONFIGS))
def test_configs_are_the_seeds_protocol(row):
    """100 epochs of 256 fresh samples at batch 16 (1,600 steps), Adam, the row's model, 50 simulations."""
    cfg = load_config(config_path(swe_table1.CONFIGS[row]))
    assert cfg.model.name == row and cfg.data.name == "shallow_water"
    assert cfg.data.batch_size == 16 and cfg.train.max_steps * cfg.data.batch_size == 100 * 256
    assert cfg.train.max_epochs is None and cfg.train.max_minutes is None
    assert cfg.optim.name == "adam" and cfg.data.num_val == 50
    assert cfg.model.kwargs.get("residual") is True
    if row.startswith("so3vit"):
        assert cfg.train.threads == 1 and cfg.model.kwargs["symmetry_breaking"] == "latitude"
    else:
        assert cfg.train.device == "cuda"


def test_rows_merge_in_table_order_and_replace_their_model_and_variant():
    old = [{"model": "so3vit_4x256", "l2": 1.0}, {"model": "so3vit_4x128", "l2": 2.0}]
    merged = swe_table1.merge_rows(old, [{"model": "so3vit_4x128", "l2": 3.0}])
    assert merged == [{"model": "so3vit_4x128", "l2": 3.0}, {"model": "so3vit_4x256", "l2": 1.0}]
    lr = {"model": "so3vit_4x128", "variant": "lr", "l2": 4.0}
    merged = swe_table1.merge_rows(merged, [lr])
    assert [swe_table1.row_key(r) for r in merged] == ["so3vit_4x128", "so3vit_4x128-lr", "so3vit_4x256"]
    assert swe_table1.merge_rows(merged, [{**lr, "l2": 5.0}])[1]["l2"] == 5.0


def test_driver_writes_a_row_with_the_seeds_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path / "cache"))
    tiny = {
        "model": {"name": "so3vit_tiny", "kwargs": {"residual": True, "symmetry_breaking": "latitude"}},
        "data": {"batch_size": 2, "num_val": 2, "val_batch_size": 2},
        "train": {"max_steps": 2, "eval_every": 0, "log_every": 1, "threads": 1, "out": str(tmp_path / "run")},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny))
    monkeypatch.setitem(swe_table1.CONFIGS, "so3vit_4x128", str(path))
    out = tmp_path / "results" / "swe_table1.json"
    monkeypatch.setattr(sys, "argv", ["swe_table1", "--rows", "so3vit_4x128", "--out", str(out)])
    swe_table1.main()
    (row,) = json.loads(out.read_text())
    assert row["model"] == "so3vit_4x128" and row["steps"] == 2 and row["epochs"] == 2 / 16
    assert (row["seed_l1"], row["seed_l2"]) == (0.045, 0.058)
    for key in ("l1", "l2", "rel_l1", "rel_l2", "persistence_l2", "wall_s"):
        assert row[key] > 0, key
    assert row["l1"] < row["l2"]  # a mean absolute error is below the root mean square
    assert len(row["loadavg_start"]) == 3 and row["threads"] == 1 and isinstance(row["load_1min_every_minute"], list)
    for name in ("loss_curve.png", "error_map.png", "metrics.json"):
        assert (out.with_suffix("") / "so3vit_4x128" / name).is_file()
    printed = capsys.readouterr().out
    assert "seed l2" in printed and "0.058" in printed
    # a variant: the same row with changed settings, beside it, in a run folder of its own
    argv = ["swe_table1", "--out", str(out), "--variant", "lr", "--set", "optim.lr=3e-3", "train.max_steps=1"]
    monkeypatch.setattr(sys, "argv", argv)
    swe_table1.main()
    base, variant = json.loads(out.read_text())
    assert base == row and variant["variant"] == "lr" and variant["steps"] == 1
    assert variant["settings"] == ["optim.lr=3e-3", "train.max_steps=1"]
    assert (tmp_path / "run-lr" / "metrics.json").is_file()
    assert (out.with_suffix("") / "so3vit_4x128-lr" / "loss_curve.png").is_file()
    monkeypatch.setattr(sys, "argv", ["swe_table1", "--out", str(out), "--set", "optim.lr=3e-3"])
    with pytest.raises(SystemExit):
        swe_table1.main()
    assert "--variant" in capsys.readouterr().err


def test_probe_settings_are_validated_like_a_config():
    from eqvit.train.config import ConfigError

    cfg = load_config(config_path(swe_table1.CONFIGS["so3vit_4x128"]))
    changed = swe_table1.with_settings(cfg, ["optim.lr=3e-3", "model.num_heads=1", "optim.grad_clip=null"])
    assert changed.optim.lr == 3e-3 and changed.model.kwargs["num_heads"] == 1 and changed.optim.grad_clip is None
    assert cfg.optim.lr == 1e-3  # the original is left alone
    with pytest.raises(ConfigError, match=r"unknown key 'lrr'; did you mean 'lr'"):
        swe_table1.with_settings(cfg, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"optim.lr: expected a value > 0"):
        swe_table1.with_settings(cfg, ["optim.lr=-1"])
    with pytest.raises(ConfigError, match=r"expected --set SECTION.KEY=VALUE.*got 'lr=3'"):
        swe_table1.with_settings(cfg, ["lr=3"])


def test_probe_writes_its_row(tmp_path, monkeypatch):
    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path / "cache"))
    tiny = {
        "model": {"name": "so3vit_tiny", "kwargs": {"residual": True, "symmetry_breaking": "latitude"}},
        "data": {"batch_size": 2, "num_val": 2, "val_batch_size": 2},
        "train": {"threads": 1, "out": str(tmp_path / "run")},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny))
    monkeypatch.setitem(swe_table1.CONFIGS, "so3vit_4x128", str(path))
    out = tmp_path / "results" / "swe_table1.json"
    argv = ["swe_table1", "--probe", "lr", "--steps", "2", "--set", "optim.lr=3e-3", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    swe_table1.main()
    (row,) = json.loads((out.with_suffix("") / "probes.json").read_text())
    assert row["name"] == "lr" and row["steps"] == 2 and row["settings"] == ["optim.lr=3e-3"]
    assert row["l2"] > 0 and row["train_loss_last_50"] > 0 and not (tmp_path / "run").exists()


def test_load_sampler_records_while_running():
    import time

    with swe_table1.LoadSampler(seconds=0.01) as load:
        time.sleep(0.1)
    count = len(load.samples)
    assert count >= 2 and all(isinstance(v, float) for v in load.samples)
    time.sleep(0.05)
    assert len(load.samples) == count  # stopped with the block


def test_example_data_is_torch_harmonics_pipeline_scored_with_its_losses():
    row = swe_table1.example_data("64x128", num=2)
    assert row["lmax"] == 22 and row["samples"] == 2
    assert 0 < row["persistence_l1"] < row["persistence_l2"]
    # the example normalises by one sample's grid statistics, eqvit by pooled spherical ones: close, not equal
    for ours, theirs in zip(row["eqvit_std"], row["example_std"]):
        assert 0.8 < ours / theirs < 1.2 and ours != theirs
