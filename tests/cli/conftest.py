"""Fixtures of the command-line tests: a shared shallow-water cache, the tiny run config, a finished run,
a guard that fails a test whose error comes after the first training step, and deliverable stop signals."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from helpers import write_config

from eqvit.train import engine
from eqvit.train.config import load_config

# The signals the stop-signal tests send, each with the disposition Python has for it in a terminal.
_STOP_SIGNALS = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
}


@pytest.fixture(autouse=True)
def deliverable_stop_signals():
    """The stop signals as Python sets them up in a terminal. A suite started as a background job
    (``make test &``) inherits SIGINT ignored, one started under ``nohup`` SIGHUP, and the CLI rightly keeps
    an ignored signal ignored; the stop-signal tests send them and expect them handled."""
    ignored = [s for s in _STOP_SIGNALS if signal.getsignal(s) is signal.SIG_IGN]
    for s in ignored:
        signal.signal(s, _STOP_SIGNALS[s])
    yield
    for s in ignored:
        signal.signal(s, signal.SIG_IGN)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("swe_cache"))


@pytest.fixture
def tiny(tmp_path: Path, cache_dir: str) -> Path:
    """The tiny run's config file in the test's own folder."""
    return write_config(tmp_path, cache_dir)


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache_dir: str) -> Path:
    """A finished two-step run of the tiny config: its folder (last.safetensors, last.json, ...)."""
    folder = tmp_path_factory.mktemp("run")
    engine.train(load_config(write_config(folder, cache_dir)), out_dir=folder / "out", progress=False)
    return folder / "out"


@pytest.fixture
def no_training(monkeypatch) -> None:
    """Any training step fails the test: the error must come before the first step."""
    monkeypatch.setattr(engine.Trainer, "train_step", lambda self: pytest.fail("a training step ran"))
