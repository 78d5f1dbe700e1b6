"""Nothing lost, nothing silently wrong around a run: concurrent runs, exports, resumes with other
settings, malformed checkpoints, odd output paths, config files with duplicate keys or non-finite numbers,
evaluations of a diverged model.

Every refusal is one paragraph on stderr with exit code 2 (``assert_one_paragraph``). Runs train
``so3vit_tiny`` for a step or two; the concurrent-run test starts one real ``eqvit train``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, assert_one_paragraph, cli, write_config
from safetensors.torch import save_file

import eqvit
from eqvit.cli import main
from eqvit.train import engine
from eqvit.train.checkpoint import OutputDirError, load_checkpoint, save_checkpoint
from eqvit.train.config import ConfigError, load_config

# ------------------------------------------------------------------------------------------------
# 4. a second `eqvit train` into a folder a run is writing to is refused, naming the process


def test_a_second_train_into_a_running_folder_exits_2_naming_the_process(capsys, tmp_path, cache_dir):
    long = write_config(tmp_path, cache_dir, name="long.yaml", train={"max_steps": 100_000})
    out = tmp_path / "busy"
    proc = subprocess.Popen(
        [sys.executable, "-m", "eqvit", "train", str(long), "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen, deadline = "", time.time() + 240
        while "1/100000" not in seen and time.time() < deadline and proc.poll() is None:
            seen += proc.stderr.read(1) or ""
        stale = out / ".last.safetensors.0a1b2c3d.tmp"  # as if the running writer were in the middle of a write
        stale.write_bytes(b"partial")
        for flags in ([], ["--overwrite"], ["--resume"]):
            code, err = cli(capsys, "train", long, "--out", out, *flags)
            assert code == 2, err
            assert_one_paragraph(err, f"{out} is in use by another eqvit train (pid {proc.pid}", ".eqvit.lock")
        assert stale.exists()  # a run that does not hold the lock removes nobody's temporaries
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert load_checkpoint(out / "last.safetensors")[1]["step"] >= 1
    assert not (out / ".eqvit.lock").exists()


def test_the_lock_is_released_after_a_run_and_a_failed_start(tiny, tmp_path):
    out = tmp_path / "out"
    engine.train(load_config(tiny), out_dir=out, max_steps=1, progress=False)
    assert not (out / ".eqvit.lock").exists()
    engine.train(load_config(tiny), out_dir=out, max_steps=2, resume=True, progress=False)
    assert load_checkpoint(out / "last.safetensors")[1]["step"] == 2


# ------------------------------------------------------------------------------------------------
# 5. best.* alone counts as a run


def test_a_folder_holding_only_a_best_model_is_a_run(capsys, tiny, tmp_path, run, no_training):
    out = tmp_path / "killed"
    out.mkdir()
    for name in ("best.safetensors", "best.json"):
        shutil.copy(run / name, out / name)
    before = (out / "best.safetensors").read_bytes()
    code, err = cli(capsys, "train", tiny, "--out", out)
    assert code == 2
    assert_one_paragraph(err, "already holds a run's best model", "best.safetensors", "--overwrite")
    code, err = cli(capsys, "train", tiny, "--out", out, "--resume")
    assert code == 2
    assert_one_paragraph(err, "no last.safetensors to resume from", "--overwrite")
    assert (out / "best.safetensors").read_bytes() == before


def test_overwrite_removes_the_previous_runs_best_model(capsys, tiny, tmp_path, run):
    out = tmp_path / "again"
    shutil.copytree(run, out)
    (out / "best.json").write_text(json.dumps({"step": 999}))
    code, err = cli(capsys, "train", tiny, "--out", out, "--overwrite", "--max-steps", "1")
    assert code == 0, err
    assert load_checkpoint(out / "last.safetensors")[1]["step"] == 1
    assert json.loads((out / "best.json").read_text())["step"] == 1


# ------------------------------------------------------------------------------------------------
# 3. export never replaces its input, and replaces another file only with --overwrite


@pytest.mark.parametrize("suffix", [".safetensors", ".onnx"])
def test_export_refuses_its_own_checkpoint_and_existing_files(capsys, tmp_path, run, suffix):
    folder = tmp_path / "copy"
    shutil.copytree(run, folder)
    checkpoint = folder / "last.safetensors"
    before = checkpoint.read_bytes()
    code, err = cli(capsys, "export", checkpoint, checkpoint)
    assert code == 2
    assert_one_paragraph(err, "is the checkpoint being exported", "Choose another file name")
    code, err = cli(capsys, "export", checkpoint, checkpoint, "--overwrite")
    assert code == 2
    assert_one_paragraph(err, "is the checkpoint being exported")
    link = tmp_path / f"link{suffix}"
    link.symlink_to(checkpoint)
    code, err = cli(capsys, "export", checkpoint, link, "--overwrite")
    assert code == 2
    assert_one_paragraph(err, "is the checkpoint being exported")
    assert checkpoint.read_bytes() == before
    target = tmp_path / f"model{suffix}"
    target.write_bytes(b"someone's file")
    code, err = cli(capsys, "export", checkpoint, target)
    assert code == 2
    assert_one_paragraph(err, f"the export target {target} exists", "--overwrite")
    assert target.read_bytes() == b"someone's file"
    code, err = cli(capsys, "export", checkpoint, target, "--overwrite")
    assert code == 0, err
    assert target.read_bytes() != b"someone's file"


def test_export_of_a_checkpoint_with_a_malformed_config_is_a_clear_error(capsys, tmp_path):
    model = eqvit.create_model("so3vit_tiny", residual=True)
    save_checkpoint(tmp_path, model, step=2, config={"model": ["so3vit_tiny"]})
    for target in ("w.safetensors", "w.onnx"):
        code, err = cli(capsys, "export", tmp_path / "last.safetensors", tmp_path / target)
        assert code == 2
        assert_one_paragraph(err, "expected config.model to be a mapping", "last.safetensors")


# ------------------------------------------------------------------------------------------------
# 10. eval compares the model config with an export's record of it


def test_eval_of_an_export_refuses_another_model_config(capsys, tmp_path, cache_dir, run):
    exported = tmp_path / "model.safetensors"
    code, err = cli(capsys, "export", run / "last.safetensors", exported)
    assert code == 0, err
    plain = write_config(tmp_path, cache_dir, name="plain.yaml", model={"kwargs": {"residual": False}})
    code, err = cli(capsys, "eval", plain, "--checkpoint", exported)
    assert code == 2
    assert_one_paragraph(err, "residual: false in the config, true in the checkpoint", "model.safetensors")
    same = write_config(tmp_path, cache_dir, name="same.yaml")
    code, err = cli(capsys, "eval", same, "--checkpoint", exported)
    assert code == 0, err


# ------------------------------------------------------------------------------------------------
# 9. a resume with other optimiser settings applies them, says so, and records them


def test_resume_applies_changed_optimiser_settings_and_says_which(capsys, tmp_path, cache_dir):
    first = write_config(tmp_path, cache_dir, name="first.yaml", optim={"name": "adamw", "weight_decay": 0.0})
    out = tmp_path / "out"
    code, err = cli(capsys, "train", first, "--out", out, "--max-steps", "1")
    assert code == 0, err
    second = write_config(tmp_path, cache_dir, name="second.yaml", optim={"name": "adamw", "weight_decay": 0.5})
    trainer = engine.Trainer(load_config(second), out, progress=True)
    assert trainer.resume()
    trainer.close()
    err = capsys.readouterr().err
    assert "optim.weight_decay 0.5 (the run had 0.0)" in err
    assert all(group["weight_decay"] == 0.5 for group in trainer.optimizer.param_groups)
    code, err = cli(capsys, "train", second, "--out", out, "--resume")
    assert code == 0, err
    assert load_checkpoint(out / "last.safetensors")[1]["optimizer"]["param_groups"][0]["weight_decay"] == 0.5


# ------------------------------------------------------------------------------------------------
# 13. a checkpoint that lacks part of the training state is named, not a traceback


def _damaged(run: Path, folder: Path, edit) -> Path:
    tensors, sidecar = load_checkpoint(run / "last.safetensors")
    edit(tensors, sidecar)
    folder.mkdir()
    save_file(tensors, str(folder / "last.safetensors"), metadata={"eqvit": json.dumps(sidecar)})
    return folder


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda t, s: s.pop("optimizer"), "'optimizer'"),
        (lambda t, s: s.update(history=None), "'history'"),
        (lambda t, s: s.update(step="two"), "'step'"),
        (lambda t, s: t.pop("rng.data"), "rng.data"),
        (lambda t, s: t.update({"rng.torch": t["rng.torch"][:100]}), "rng.torch"),
        (lambda t, s: s["optimizer"].update(param_groups=[]), "optimiser state does not fit"),
    ],
)
def test_a_malformed_checkpoint_cannot_be_resumed_and_says_why(capsys, tiny, tmp_path, run, edit, needle):
    out = _damaged(run, tmp_path / "damaged", edit)
    code, err = cli(capsys, "train", tiny, "--out", out, "--resume")
    assert code == 2
    assert_one_paragraph(err, str(out / "last.safetensors"), needle)


def test_a_model_with_other_output_channels_is_refused_before_training(capsys, tmp_path, cache_dir, no_training):
    config = write_config(tmp_path, cache_dir, model={"kwargs": {"residual": False, "out_chans": 5}})
    code, err = cli(capsys, "train", config, "--out", tmp_path / "out")
    assert code == 2
    assert_one_paragraph(err, "5 output channels", "3")


# ------------------------------------------------------------------------------------------------
# 15. odd output paths, config files and diverged models


def test_an_empty_out_is_an_error_not_the_default(capsys, tiny, tmp_path, no_training):
    for command in (["train", tiny, "--out", ""], ["eval", tiny, "--checkpoint", ""], ["export", "", "x.safetensors"]):
        with pytest.raises(SystemExit) as info:
            main([str(a) for a in command])
        assert info.value.code == 2
        assert "expected a path, got an empty string" in capsys.readouterr().err
    with pytest.raises(OutputDirError, match="--out is empty"):
        engine.train(load_config(tiny), out_dir="", progress=False)


def test_a_symlink_loop_as_out_is_named(capsys, tiny, tmp_path, no_training):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code, err = cli(capsys, "train", tiny, "--out", loop)
    assert code == 2
    assert_one_paragraph(err, f"--out {loop} is a symbolic link that loops")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    code, err = cli(capsys, "train", tiny, "--out", dangling)
    assert code == 2
    assert_one_paragraph(err, "which does not exist")


def test_a_failed_model_build_leaves_no_folder(capsys, tmp_path, cache_dir):
    config = write_config(tmp_path, cache_dir, model={"kwargs": {"embeddim": 8}})
    out = tmp_path / "new" / "run"
    code, err = cli(capsys, "train", config, "--out", out)
    assert code == 2
    assert_one_paragraph(err, "'embeddim'")
    assert not (tmp_path / "new").exists()


def test_duplicate_yaml_keys_are_named_with_their_lines(capsys, tmp_path, no_training):
    path = tmp_path / "dup.yaml"
    path.write_text("model: {name: so3vit_tiny}\noptim:\n  lr: 0.1\n  weight_decay: 0.0\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'lr' at line 5 \(first at line 3\)"):
        load_config(path)
    path.write_text("train: {max_steps: 1, max_steps: 2}\n")
    with pytest.raises(ConfigError, match="duplicate key 'max_steps'"):
        load_config(path)


def test_a_config_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00model")
    with pytest.raises(ConfigError, match=f"{path}: not UTF-8 text"):
        load_config(path)


@pytest.mark.parametrize(
    ("section", "values", "where"),
    [
        ("schedule", {"min_lr": float("nan")}, "schedule.min_lr"),
        ("optim", {"lr": float("inf")}, "optim.lr"),
        ("optim", {"grad_clip": float("nan")}, "optim.grad_clip"),
        ("optim", {"weight_decay": float("nan")}, "optim.weight_decay"),
        ("train", {"max_minutes": float("inf")}, "train.max_minutes"),
        ("data", {"dt_hours": float("nan")}, "data.dt_hours"),
        ("model", {"kwargs": {"drop_path_rate": float("nan")}}, "model.kwargs.drop_path_rate"),
    ],
)
def test_non_finite_numbers_are_refused_everywhere(capsys, tmp_path, cache_dir, section, values, where, no_training):
    config = write_config(tmp_path, cache_dir, **{section: values})
    code, err = cli(capsys, "train", config, "--out", tmp_path / "out")
    assert code == 2
    assert_one_paragraph(err, f"{config}: {where}: expected a finite number")  # the file, then the field


def test_eval_json_of_a_diverged_model_is_valid_json_with_a_warning(capsys, tiny, tmp_path, run):
    tensors, sidecar = load_checkpoint(run / "last.safetensors")
    model = eqvit.create_model("so3vit_tiny", residual=True)
    state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    state = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in state.items()}
    model.load_state_dict(state)
    save_checkpoint(tmp_path / "nan", model, step=2, config=sidecar["config"], extra={"model_config": model.config})
    out = tmp_path / "metrics.json"
    code, err = cli(capsys, "eval", tiny, "--checkpoint", tmp_path / "nan" / "last.safetensors", "--json", out)
    assert code == 1
    assert "eqvit: warning: the model's metrics are not finite" in err and "written as null" in err
    metrics = json.loads(out.read_text())  # valid JSON: no NaN
    assert metrics["metrics"]["rel_l2"] is None
    assert metrics["persistence"]["rel_l2"] > 0


@pytest.mark.parametrize("suffix", [".safetensors", ".onnx"])
def test_exports_get_the_umask_mode(capsys, tmp_path, run, suffix):
    previous = os.umask(0o002)
    try:
        code, err = cli(capsys, "export", run / "last.safetensors", tmp_path / f"model{suffix}")
    finally:
        os.umask(previous)
    assert code == 0, err
    assert (tmp_path / f"model{suffix}").stat().st_mode & 0o777 == 0o664
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"model{suffix}"]
