"""The training engine and CLI behave the way timm / Lightning users expect when things go wrong.

Every test trains ``so3vit_tiny`` (642 vertices, 240 tokens) for a few steps on shallow water.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import yaml
from helpers import ROOT

from eqvit.bench.kill_resume import losses

TINY = {
    "model": {"name": "so3vit_tiny", "kwargs": {"residual": True}},
    "data": {"batch_size": 2, "num_val": 2, "val_batch_size": 2},
    "train": {"max_steps": 6, "eval_every": 0, "log_every": 1, "threads": 1},
}


@pytest.fixture
def tiny_config(tmp_path, monkeypatch):
    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eqvit", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def assert_same_curve(a, b):
    assert [s for s, _ in a] == [s for s, _ in b]
    for (step, la), (_, lb) in zip(a, b):
        assert abs(la - lb) <= 1e-6 * max(1.0, abs(la)), f"step {step}: {la} != {lb}"


def test_list_shows_every_registered_model():
    import eqvit

    result = run_cli("list")
    assert result.returncode == 0
    assert result.stdout.split() == eqvit.list_models()


def test_info_and_help(capsys):
    from eqvit.cli import main

    assert main(["info", "so3vit_tiny"]) == 0
    out = capsys.readouterr().out
    assert "icosphere level 3" in out and "I (order 60)" in out
    for command in ("train", "eval", "check", "list", "info", "bench", "groups"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert "usage: eqvit " + command in capsys.readouterr().out


def test_resume_reaches_the_step_asked_and_matches_the_uninterrupted_run(tiny_config, tmp_path):
    from eqvit.train.config import load_config
    from eqvit.train.engine import train

    full = train(load_config(tiny_config), out_dir=tmp_path / "full", progress=False)
    assert full["steps"] == 6
    first = train(load_config(tiny_config), out_dir=tmp_path / "split", max_steps=2, progress=False)
    assert first["steps"] == 2
    second = train(load_config(tiny_config), out_dir=tmp_path / "split", max_steps=4, resume=True, progress=False)
    assert second["steps"] == 4
    third = train(load_config(tiny_config), out_dir=tmp_path / "split", resume=True, progress=False)
    assert third["steps"] == 6
    assert_same_curve(losses(tmp_path / "full"), losses(tmp_path / "split"))
    # the weights agree too
    from eqvit.train.checkpoint import load_checkpoint

    a, _ = load_checkpoint(tmp_path / "full" / "last.safetensors")
    b, _ = load_checkpoint(tmp_path / "split" / "last.safetensors")
    assert all((a[k] - b[k]).abs().max() <= 1e-6 for k in a if k.startswith("model."))


def test_a_different_seed_gives_a_different_curve(tiny_config, tmp_path):
    """The resume test above could pass vacuously if every run were identical; it is not."""
    from eqvit.train.config import load_config
    from eqvit.train.engine import train

    cfg = load_config(tiny_config)
    train(cfg, out_dir=tmp_path / "a", max_steps=2, progress=False)
    cfg = load_config(tiny_config)
    cfg.data.seed = 1
    train(cfg, out_dir=tmp_path / "b", max_steps=2, progress=False)
    assert losses(tmp_path / "a")[1][1] != losses(tmp_path / "b")[1][1]


def test_resume_after_sigkill_at_a_random_moment(tiny_config, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "eqvit", "train", str(tiny_config), "--out", str(out), "--checkpoint-every", "1"]
    env = {**os.environ, "EQVIT_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (out / "last.safetensors").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(random.Random(0).uniform(0.0, 1.0))  # somewhere in the middle of a step (or a write)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    result = run_cli(
        "train", str(tiny_config), "--out", str(out), "--resume", env={"EQVIT_CACHE": str(tmp_path / "cache")}
    )
    assert result.returncode == 0, result.stderr
    from eqvit.train.config import load_config
    from eqvit.train.engine import train

    train(load_config(tiny_config), out_dir=tmp_path / "full", progress=False)
    assert_same_curve(losses(tmp_path / "full"), losses(out))


def test_corrupt_checkpoint_is_a_clear_error(tiny_config, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "last.safetensors").write_bytes(b"\x00\x01garbage")
    result = run_cli("train", str(tiny_config), "--out", str(out), "--resume", env={"EQVIT_CACHE": str(tmp_path / "c")})
    assert result.returncode == 2
    assert "last.safetensors" in result.stderr and "corrupt" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli("eval", str(tiny_config), "--checkpoint", str(out / "last.safetensors"))
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_config_typo_is_a_clear_error(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("model: {name: so3vit_tiny}\noptim: {lrr: 0.1}\n")
    result = run_cli("train", str(path))
    assert result.returncode == 2
    assert "'lrr'" in result.stderr and "'lr'" in result.stderr and "Traceback" not in result.stderr


def test_unknown_model_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {name: so3vit_tiyn}\n")
    result = run_cli("train", str(path))
    assert result.returncode == 2 and "so3vit_tiny" in result.stderr and "Traceback" not in result.stderr


def test_nan_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tiny_config, tmp_path, monkeypatch):
    from eqvit.train.config import load_config
    from eqvit.train.engine import Trainer

    trainer = Trainer(load_config(tiny_config), tmp_path / "nan", progress=False)
    trainer.config.train.checkpoint_every = 1
    original = trainer.task.loss
    calls = {"n": 0}

    def poisoned(pred, target):
        calls["n"] += 1
        loss = original(pred, target)
        return loss * float("nan") if calls["n"] == 3 else loss

    monkeypatch.setattr(trainer.task, "loss", poisoned)
    with pytest.raises(FloatingPointError, match="step 3"):
        trainer.fit()
    from eqvit.train.checkpoint import load_checkpoint

    _, sidecar = load_checkpoint(tmp_path / "nan" / "last.safetensors")
    assert sidecar["step"] == 2


def test_torchrun_two_processes_matches_one_process(tiny_config, tmp_path):
    """DDP (gloo) with the same global batch gives the same loss as one process."""
    env = {**os.environ, "EQVIT_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "eqvit",
        "train",
        str(tiny_config),
        "--out",
        str(out),
        "--max-steps",
        "3",
    ]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in out.glob("last*")) == ["last.json", "last.safetensors"]
    from eqvit.train.config import load_config
    from eqvit.train.engine import train

    train(load_config(tiny_config), out_dir=tmp_path / "single", max_steps=3, progress=False)
    single, ddp = losses(tmp_path / "single"), losses(out)
    assert [s for s, _ in ddp] == [1, 2, 3]
    for (_, a), (_, b) in zip(single, ddp):
        assert abs(a - b) <= 1e-4 * abs(a)


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tiny_config, tmp_path):
    out = tmp_path / "interrupted"
    big = yaml.safe_load(tiny_config.read_text())
    big["train"]["max_steps"] = 10_000
    config = tmp_path / "long.yaml"
    config.write_text(yaml.safe_dump(big))
    cmd = [sys.executable, "-m", "eqvit", "train", str(config), "--out", str(out)]
    env = {**os.environ, "EQVIT_CACHE": str(tmp_path / "cache")}
    # A job started in the background (`make test &`, nohup) inherits an ignored SIGINT, and Python
    # then installs no KeyboardInterrupt handler: restore the default in the child, as a terminal has it.
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # wait until training runs (the progress bar reports a step), then interrupt
    deadline = time.time() + 240
    seen = ""
    while time.time() < deadline and "1/10000" not in seen and proc.poll() is None:
        seen += proc.stderr.read(1) or ""
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr and "Traceback" not in stderr
    from eqvit.train.checkpoint import load_checkpoint

    _, sidecar = load_checkpoint(out / "last.safetensors")
    assert sidecar["step"] >= 1
