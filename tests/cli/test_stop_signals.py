"""A run stopped by a signal or an error keeps its last completed step, and resuming it is exact.

SIGINT, SIGTERM and SIGHUP save a checkpoint and exit 130, 143, 129; a second signal does not cut that
save; the RNG states saved for a step that began but did not complete are those from before it, so
``--resume`` reproduces the uninterrupted run bit for bit; an error in a step saves the last completed
step before it is reported, and no message claims a checkpoint that is not there. The signals are sent
in-process from inside a step (deterministic), and once to a real ``eqvit train`` at a random moment.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import helpers
import pytest
import torch
from helpers import ROOT, cli

from eqvit.bench.kill_resume import differences
from eqvit.train import checkpoint as ckpt_module
from eqvit.train import engine
from eqvit.train.checkpoint import load_checkpoint
from eqvit.train.config import load_config
from eqvit.train.signals import Interrupted, shielded, stop_signals


def write_config(folder: Path, cache_dir: str, name: str = "tiny.yaml", **train) -> Path:
    """The tiny run for six steps, with ``train`` settings changed."""
    return helpers.write_config(folder, cache_dir, name, train={"max_steps": 6, **train})


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_dir):
    """The six-step run every stopped-and-resumed run must reproduce exactly."""
    folder = tmp_path_factory.mktemp("full")
    engine.train(load_config(write_config(folder, cache_dir)), out_dir=folder / "out", progress=False)
    return folder / "out"


def assert_bit_identical(a: Path, b: Path) -> None:
    """The same losses (history.csv) and the same model and optimiser tensors (last.safetensors), bit for bit."""
    differ = differences(a, b)
    assert not differ, differ


def signal_at_loss_call(monkeypatch, signum: int, call: int) -> None:
    """Send ``signum`` to this process from inside the loss of the ``call``-th step: its batch and dropout
    noise are drawn, its update is not done."""
    from eqvit.train.tasks import ShallowWaterTask

    real_loss = ShallowWaterTask.loss
    calls = {"n": 0}

    def loss(self, pred, target):
        calls["n"] += 1
        if calls["n"] == call:
            os.kill(os.getpid(), signum)
        return real_loss(self, pred, target)

    monkeypatch.setattr(ShallowWaterTask, "loss", loss)


# ------------------------------------------------------------------------------------------------
# 1, 6, 7. every stop signal saves, exits with the shell's code, and resumes bit for bit


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_mid_step_saves_and_the_resume_is_exact(
    capsys, monkeypatch, tmp_path, cache_dir, uninterrupted, signum, code
):
    config = write_config(tmp_path, cache_dir)
    out = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        signal_at_loss_call(patch, signum, call=4)
        got, err = cli(capsys, "train", config, "--out", out)
    assert got == code, err
    name = signal.Signals(signum).name
    assert f"eqvit: interrupted by {name}" in err and "Traceback" not in err
    assert f"the checkpoint of step 3 (the last completed) is in {out / 'last.safetensors'}" in err
    assert load_checkpoint(out / "last.safetensors")[1]["step"] == 3
    assert not (out / ".eqvit.lock").exists()
    got, err = cli(capsys, "train", config, "--out", out, "--resume")
    assert got == 0, err
    assert_bit_identical(uninterrupted, out)


def test_the_data_state_of_an_unfinished_step_is_the_one_before_it(monkeypatch, tmp_path, cache_dir):
    """What a checkpoint would save for a step that drew its batch and was then stopped: the states it began with."""
    trainer = engine.Trainer(load_config(write_config(tmp_path, cache_dir)), tmp_path / "out", progress=False)
    trainer.start()
    before = {"rng.data": trainer.task.data_state().clone(), "rng.torch": torch.get_rng_state()}
    signal_at_loss_call(monkeypatch, signal.SIGTERM, call=1)
    with pytest.raises(Interrupted) as info:
        trainer.train_for(float("inf"))
    trainer.close()
    assert info.value.signum == signal.SIGTERM and trainer.step == 0
    assert "no checkpoint was written: no training step had completed" in info.value.__notes__
    assert not (tmp_path / "out" / "last.safetensors").exists()
    assert not torch.equal(trainer.task.data_state(), before["rng.data"])  # the step drew its batch ...
    saved = trainer._rng_tensors()
    assert all(torch.equal(saved[k], before[k]) for k in before)  # ... and would be saved from before it


def test_a_second_signal_does_not_cut_the_save(capsys, monkeypatch, tmp_path, cache_dir):
    config = write_config(tmp_path, cache_dir)
    out = tmp_path / "twice"
    real_save = ckpt_module.save_file

    def save_file_signalled(tensors, filename, metadata=None):
        os.kill(os.getpid(), signal.SIGINT)  # the second signal, while the first one's checkpoint is written
        time.sleep(0.01)
        real_save(tensors, filename, metadata=metadata)

    signal_at_loss_call(monkeypatch, signal.SIGINT, call=3)
    monkeypatch.setattr(ckpt_module, "save_file", save_file_signalled)
    code, err = cli(capsys, "train", config, "--out", out)
    assert code == 130, err
    assert load_checkpoint(out / "last.safetensors")[1]["step"] == 2
    assert "the checkpoint of step 2 (the last completed) is in" in err
    assert sorted(p.name for p in out.iterdir()) == ["last.json", "last.safetensors"]


def test_a_signal_during_a_periodic_save_waits_for_it(capsys, monkeypatch, tmp_path, cache_dir):
    config = write_config(tmp_path, cache_dir)
    out = tmp_path / "periodic"
    real_save = ckpt_module.save_file
    calls = {"n": 0}

    def save_file_signalled(tensors, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(ckpt_module, "save_file", save_file_signalled)
    code, err = cli(capsys, "train", config, "--out", out, "--checkpoint-every", "1")
    assert code == 143, err
    assert "the checkpoint of step 2 (the last completed)" in err
    assert load_checkpoint(out / "last.safetensors")[1]["step"] == 2


def test_shielded_holds_a_signal_until_the_block_ends():
    with stop_signals():
        done = []
        with pytest.raises(Interrupted) as info:
            with shielded():
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(0.01)
                done.append("the block ran to its end")
        assert done and info.value.signum == signal.SIGHUP and info.value.exit_code == 129


# ------------------------------------------------------------------------------------------------
# 2. an error in a step keeps the last completed step, and the message says where (or that none is)


def test_an_error_in_a_step_saves_the_last_completed_one_first(capsys, monkeypatch, tmp_path, cache_dir, uninterrupted):
    from eqvit.train.tasks import ShallowWaterTask

    config = write_config(tmp_path, cache_dir)
    out = tmp_path / "broken"
    real_batch = ShallowWaterTask.train_batch
    calls = {"n": 0}

    def batch(self):
        calls["n"] += 1
        x, y = real_batch(self)  # the stream moves on, then the step fails
        if calls["n"] == 4:
            raise OSError(f"cannot read image {tmp_path / 'broken.jpg'}: image file is truncated")
        return x, y

    with monkeypatch.context() as patch:
        patch.setattr(ShallowWaterTask, "train_batch", batch)
        code, err = cli(capsys, "train", config, "--out", out)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("eqvit: error: cannot read image") and "broken.jpg" in line
    assert "the checkpoint of step 3 (the last completed) is in" in line and "--resume" in line
    assert load_checkpoint(out / "last.safetensors")[1]["step"] == 3
    code, err = cli(capsys, "train", config, "--out", out, "--resume")
    assert code == 0, err
    assert_bit_identical(uninterrupted, out)


@pytest.mark.parametrize("bad_step", [1, 3])
def test_a_nan_loss_never_claims_a_checkpoint_that_is_not_there(capsys, monkeypatch, tmp_path, cache_dir, bad_step):
    from eqvit.train.tasks import ShallowWaterTask

    config = write_config(tmp_path, cache_dir)
    out = tmp_path / "nan"
    real_loss = ShallowWaterTask.loss
    calls = {"n": 0}

    def loss(self, pred, target):
        calls["n"] += 1
        value = real_loss(self, pred, target)
        return value * float("nan") if calls["n"] == bad_step else value

    monkeypatch.setattr(ShallowWaterTask, "loss", loss)
    code, err = cli(capsys, "train", config, "--out", out)
    assert code == 2
    assert f"loss is nan at step {bad_step}" in err
    if bad_step == 1:
        assert "no checkpoint was written: no training step had completed" in err
        assert not (out / "last.safetensors").exists()
        assert "checkpoint in" not in err and "is kept" not in err
    else:
        assert f"the checkpoint of step {bad_step - 1} (the last completed) is in" in err
        assert "lower optim.lr" in err  # resuming unchanged would diverge again
        assert load_checkpoint(out / "last.safetensors")[1]["step"] == bad_step - 1


# ------------------------------------------------------------------------------------------------
# 7. Ctrl-C of a real `eqvit train` at a random moment, then --resume: the same run, bit for bit


def test_resume_after_sigint_at_a_random_moment_is_exact(tmp_path, cache_dir):
    config = write_config(tmp_path, cache_dir, max_steps=40)
    out = tmp_path / "interrupted"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "eqvit", "train", str(config), "--out", str(out)]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal has it
    )
    seen, deadline = "", time.time() + 240
    while "1/40" not in seen and time.time() < deadline and proc.poll() is None:
        seen += proc.stderr.read(1) or ""
    time.sleep(random.Random(1).uniform(0.0, 0.5))  # somewhere in a step, between steps or in a write
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), (seen + stderr)[-2000:]
    result = subprocess.run([*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    engine.train(load_config(config), out_dir=tmp_path / "full", progress=False)
    assert_bit_identical(tmp_path / "full", out)


def test_two_sigints_20_ms_apart_to_a_real_train_exit_130_with_the_checkpoint_named(tmp_path, cache_dir):
    """The second signal lands in the save, in the message or in the exit: none of them is cut, the exit code
    stays the shell's, and the checkpoint the message names is there."""
    config = write_config(tmp_path, cache_dir, max_steps=100_000)
    out = tmp_path / "twice"
    proc = subprocess.Popen(
        [sys.executable, "-m", "eqvit", "train", str(config), "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen, deadline = "", time.time() + 240
    while "2/100000" not in seen and time.time() < deadline and proc.poll() is None:
        seen += proc.stderr.read(1) or ""
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (seen + stderr)[-2000:]
    step = load_checkpoint(out / "last.safetensors")[1]["step"]
    assert f"the checkpoint of step {step} (the last completed) is in {out / 'last.safetensors'}" in stderr


def test_a_stop_during_an_evaluation_resumes_with_that_evaluation(capsys, monkeypatch, tmp_path, cache_dir):
    """Stopped inside the periodic evaluation of step 2: the checkpoint is step 2's, and the resumed run does that
    evaluation first; its losses, weights and evaluations are the uninterrupted run's."""
    from eqvit.train.tasks import ShallowWaterTask

    config = write_config(tmp_path, cache_dir, eval_every=2)
    engine.train(load_config(config), out_dir=tmp_path / "full", progress=False)
    real_evaluate = ShallowWaterTask.evaluate
    calls = {"n": 0}

    def evaluate(self, model):
        if model is not None:
            calls["n"] += 1
            if calls["n"] == 1:
                os.kill(os.getpid(), signal.SIGTERM)
        return real_evaluate(self, model)

    out = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        patch.setattr(ShallowWaterTask, "evaluate", evaluate)
        code, err = cli(capsys, "train", config, "--out", out)
    assert code == 143, err
    assert "the checkpoint of step 2 (the last completed)" in err
    code, err = cli(capsys, "train", config, "--out", out, "--resume")
    assert code == 0, err
    assert_bit_identical(tmp_path / "full", out)
    evals = [json.loads((folder / "evals.json").read_text()) for folder in (tmp_path / "full", out)]
    assert [row["step"] for row in evals[1]] == [2, 4, 6]
    assert evals[0] == evals[1]
