"""Autoregressive rollouts on shallow water (eqvit.train.rollout) and the sphere maps they draw.

The tiny SO3ViT (642 vertices) rolls out from two validation initial conditions; the checks tie
the rollout to the one-step evaluation, to the solver and to a model that blows up.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

TINY = {
    "model": {"name": "so3vit_tiny", "kwargs": {"residual": True, "symmetry_breaking": "latitude"}},
    "data": {"batch_size": 2, "num_val": 2, "val_batch_size": 1},
    "train": {"max_steps": 2, "eval_every": 0, "log_every": 1, "threads": 1},
}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """(config path, trainer) for so3vit_tiny trained two steps, validation cached under tmp_path."""
    from eqvit.train.config import load_config
    from eqvit.train.engine import Trainer

    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    trainer = Trainer(load_config(path), out_dir=tmp_path / "run", progress=False)
    trainer.fit()
    return path, trainer


def test_step_one_is_the_one_step_evaluation_and_truth_is_the_solver(tiny):
    from eqvit.train.rollout import rollout

    _, trainer = tiny
    model, task = trainer.model, trainer.task
    result = rollout(model, task, 3)
    one = task.evaluate(model)
    base = task.evaluate(None)
    first = result["steps"][0]
    assert first["rel_l2"] == pytest.approx(one["rel_l2"], rel=1e-6)
    assert first["rel_l1"] == pytest.approx(one["rel_l1"], rel=1e-6)
    assert first["polar_error_ratio"] == pytest.approx(one["polar_error_ratio"], rel=1e-6)
    assert first["persistence_rel_l2"] == pytest.approx(base["rel_l2"], rel=1e-6)
    for key in ("l1", "l2"):  # the seed's errors too
        assert first[key] == pytest.approx(one[key], rel=1e-6)
        assert first[f"persistence_{key}"] == pytest.approx(base[key], rel=1e-6)
    assert [s["step"] for s in result["steps"]] == [1, 2, 3]
    assert result["first_nonfinite_step"] is None
    # persistence at step 3 is the initial state against the solver's state 3 hours on
    from eqvit.train.metrics import relative_lp_error

    val, data = task.validation, task.data
    truth = data.fields(data.step(val.spec_x, 3), "points").double()
    expected = relative_lp_error(val.x_points.double(), truth, task.weights, p=2, reduction="none").mean(1).mean()
    assert result["steps"][2]["persistence_rel_l2"] == pytest.approx(float(expected), rel=1e-6)


class _BlowsUp(torch.nn.Module):
    """Identity for one step, then inf: a rollout must report step 2, not crash."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x if self.calls % 2 == 1 else x * float("inf")


def test_first_nonfinite_step_is_reported(tiny, tmp_path):
    from eqvit.train.rollout import plot_rollout, rollout, rollout_json, rollout_table

    _, trainer = tiny
    trainer.task.cfg.val_batch_size = 2  # one batch: the model is called once per step
    result = rollout(_BlowsUp(), trainer.task, 3)
    assert result["first_nonfinite_step"] == 2
    steps = result["steps"]
    assert steps[0]["rel_l2"] == pytest.approx(steps[0]["persistence_rel_l2"])  # identity = persistence
    assert steps[1]["rel_l2"] is None and steps[2]["rel_l1"] is None
    assert all(s["persistence_rel_l2"] > 0 for s in steps)
    assert "not finite from step 2" in rollout_table(result)
    json.dumps(rollout_json(result))
    plot_rollout(result, tmp_path / "rollout.png", "blows up")
    assert (tmp_path / "rollout.png").stat().st_size > 10_000


def test_eval_rollout_cli_writes_json_and_png(tiny, tmp_path):
    from eqvit.cli import main

    path, trainer = tiny
    out = tmp_path / "roll"
    assert (
        main(
            [
                "eval",
                str(path),
                "--checkpoint",
                str(trainer.out / "last.safetensors"),
                "--rollout",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "rollout.json").read_text())
    wanted = {"rel_l1", "rel_l2", "l1", "l2", "persistence_rel_l1", "persistence_rel_l2", "persistence_l2"}
    wanted.add("polar_error_ratio")
    assert all(wanted <= set(step) for step in report["steps"])
    assert len(report["steps"]) == 2 and report["model"] == "so3vit_tiny"
    assert len(report["loadavg_start"]) == len(report["loadavg_end"]) == 3 and report["threads"] >= 1
    assert (out / "rollout.png").stat().st_size > 10_000


def test_eval_rollout_user_errors_exit_2(tiny, tmp_path, capsys):
    from eqvit.cli import main

    path, trainer = tiny
    ck = str(trainer.out / "last.safetensors")
    assert main(["eval", str(path), "--checkpoint", ck, "--rollout", "2"]) == 2
    assert "--out" in capsys.readouterr().err
    other = tmp_path / "mnist.yaml"
    other.write_text(yaml.safe_dump({"model": {"name": "o2vit_tiny"}, "data": {"name": "rotated_mnist"}}))
    assert main(["eval", str(other), "--checkpoint", ck, "--rollout", "2", "--out", str(tmp_path / "x")]) == 2
    assert "shallow_water" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        main(["eval", str(path), "--checkpoint", ck, "--rollout", "0", "--out", str(tmp_path / "x")])
    assert err.value.code == 2


# ---------------------------------------------------------------------------------- maps


def test_mesh_is_cut_at_the_date_line_and_poles_take_their_neighbours_longitude():
    from eqvit.geometry.icosphere import icosphere
    from eqvit.train.metrics import _mesh_lonlat, sphere_mesh

    sphere = icosphere(3)
    faces = sphere_mesh(sphere.vertices)
    assert np.array_equal(faces, np.asarray(sphere.faces))
    lon, _, index = _mesh_lonlat(sphere.vertices, faces)
    span = lon.max(1) - lon.min(1)
    assert span.max() < 1.3  # no triangle drawn across the map (the widest: 72 deg, around a pole)
    straddling = np.bincount(index, minlength=len(faces)) == 2
    assert straddling.any()  # the date-line triangles are drawn twice, once on each side
    # a convex hull of other points is a closed mesh too: every edge in two triangles
    pts = np.random.default_rng(0).normal(size=(200, 3))
    pts /= np.linalg.norm(pts, axis=1, keepdims=True)
    hull = sphere_mesh(pts)
    assert len(hull) == 2 * len(pts) - 4


def test_plot_sphere_maps_icosphere_and_grid_share_one_scale(tmp_path):
    from eqvit.geometry.icosphere import icosphere
    from eqvit.train.metrics import map_keywords, mollweide, plot_sphere_maps

    ico = np.abs(icosphere(3).vertices[:, 2])
    grid = np.linspace(0, 2, 16 * 32).reshape(16, 32)
    plot_sphere_maps([dict(title="ico", values=ico), dict(title="grid", values=grid)], tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 10_000
    assert map_keywords(ico)["points"].shape == (642, 3)
    assert map_keywords(grid)["latitudes"].shape == (16,)
    with pytest.raises(ValueError, match="icosphere"):
        map_keywords(np.zeros(100))
    x, y = mollweide(np.array([np.pi, 0.0]), np.array([0.0, np.pi / 2]))
    assert x[0] == pytest.approx(2 * np.sqrt(2)) and y[1] == pytest.approx(np.sqrt(2))


def test_sweep_quick(tmp_path):
    from eqvit.bench import so3vit_sweep

    so3vit_sweep.main(["--quick", "--max-steps", "1", "--num-val", "1", "--out", str(tmp_path / "sweep")])
    result = json.loads(Path(tmp_path / "sweep" / "so3vit_sweep.json").read_text())
    assert {r["label"] for r in result["rows"]} == {"1x32h1", "1x32h2"}
    assert all(r["steps"] == 1 and r["rel_l2"] > 0 for r in result["rows"])
    assert result["pareto_front"]
    assert (tmp_path / "sweep" / "pareto.png").exists()


def test_pareto_front():
    from eqvit.bench.so3vit_sweep import cells, pareto_front

    rows = [
        {"label": "a", "epoch_seconds": 1.0, "rel_l2": 0.5},
        {"label": "b", "epoch_seconds": 2.0, "rel_l2": 0.6},  # slower and worse than a
        {"label": "c", "epoch_seconds": 3.0, "rel_l2": 0.3},
    ]
    assert pareto_front(rows) == ["a", "c"]
    assert len(cells({"depth": [4, 8, 16, 32, 64], "heads": [1, 2, 4, 8], "width": [128, 256, 512]})) == 60


def test_bare_blocks_spec_matches_the_candidate():
    import eqvit
    from eqvit.bench.so3vit_vs_s2transformer import bare_spec, build, count_params, example_input

    model = eqvit.create_model("so3vit_tiny")
    spec = bare_spec(model)
    assert spec == "timm_blocks:2x32,2h,240t"
    bare = build(spec)
    assert count_params(bare) == sum(p.numel() for p in model.blocks.parameters())
    assert bare(example_input(bare, 2, torch.device("cpu"))).shape == (2, 240, 32)
    with pytest.raises(ValueError, match="bare-block spec"):
        build("timm_blocks:4x128")


def test_checkpoint_of_another_head_count_names_num_heads(tmp_path, monkeypatch):
    """so3vit_4x256 / *x512 changed their heads (8 -> 4): a checkpoint of the old count is refused with
    a message naming ``num_heads``, and loads once the config says ``num_heads: 8`` (here: tiny, 1 vs 2)."""
    from eqvit.train.checkpoint import CheckpointError
    from eqvit.train.config import load_config
    from eqvit.train.engine import Trainer, evaluate_checkpoint

    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path / "cache"))
    old = dict(TINY, model={"name": "so3vit_tiny", "kwargs": {"residual": True, "num_heads": 1}})
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    trainer = Trainer(load_config(tmp_path / "old.yaml"), out_dir=tmp_path / "old", progress=False)
    trainer.fit(max_steps=1)
    ck = tmp_path / "old" / "last.safetensors"
    now = dict(TINY, model={"name": "so3vit_tiny", "kwargs": {"residual": True}})
    (tmp_path / "now.yaml").write_text(yaml.safe_dump(now))
    with pytest.raises(CheckpointError, match="num_heads: 2 in the config, 1 in the checkpoint"):
        evaluate_checkpoint(load_config(tmp_path / "now.yaml"), ck, progress=False)
    assert evaluate_checkpoint(load_config(tmp_path / "old.yaml"), ck, progress=False)["metrics"]["rel_l2"] > 0
