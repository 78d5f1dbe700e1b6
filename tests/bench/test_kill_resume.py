"""benchmarks/kill_resume.py (eqvit bench kill_resume): real runs stopped by kill -9 / SIGINT / SIGTERM and resumed
equal the uninterrupted run bit for bit, and the comparison that says so can say otherwise."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import nn

from eqvit.bench import kill_resume
from eqvit.train.checkpoint import save_checkpoint

ROW_KEYS = {"signal", "delay_s", "exit_code", "checkpoint_before_resume", "resumes", "exact"}


@pytest.mark.slow
def test_three_stopped_and_resumed_runs_are_exact(tmp_path):
    out = tmp_path / "kill_resume.json"
    code = kill_resume.main(["--tries", "3", "--steps", "6", "--out", str(out), "--work", str(tmp_path / "work")])
    result = json.loads(out.read_text())
    assert code == 0, [row["differences"] for row in result["rows"]]
    assert result["tries"] == 3 and result["exact"] == 3
    assert set(result["by_signal"]) == {"SIGKILL", "SIGINT", "SIGTERM"}
    for name, counts in result["by_signal"].items():
        assert counts["tries"] == counts["exact"] == 1
        assert sum(counts["exit_codes"].values()) == 1
        # the signal's own exit, the CLI's orderly one after its save, or 0 when the run had already finished
        number = int(getattr(kill_resume.signal, name))
        assert set(counts["exit_codes"]) <= {"0", str(-number), str(128 + number)}
    assert [row["signal"] for row in result["rows"]] == ["SIGKILL", "SIGINT", "SIGTERM"]
    for row in result["rows"]:
        assert ROW_KEYS <= set(row) and row["exact"] and row["differences"] == [] and row["completed"]
        if row["signal"] != "SIGKILL" and row["exit_code"] < 0:
            # SIGINT / SIGTERM end the run by themselves only when they land before the CLI set its handlers
            # (a delay drawn before the reference's progress bar, on a try that started slower): nothing saved yet
            assert not row["checkpoint_before_resume"]
        assert row["resumes"] == (0 if row["exit_code"] == 0 else len(row["resume_exit_codes"]))
    assert len(result["loadavg_start"]) == len(result["loadavg_end"]) == 3
    assert {"date", "machine", "settings"} <= set(result) and result["machine"]["torch"] == torch.__version__
    assert result["settings"]["steps"] == 6


def _finished_run(folder, seed: int = 0):
    """A stand-in for a finished run: last.safetensors (model, optimiser, RNG) and history.csv."""
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).square().mean().backward()
    optimizer.step()
    folder.mkdir(parents=True)
    save_checkpoint(
        folder, model, step=2, config={}, optimizer=optimizer, extra_tensors={"rng.torch": torch.get_rng_state()}
    )
    (folder / "history.csv").write_text("step,loss\n1,2.25\n2,2.1875\n")
    return model, optimizer


def test_the_comparison_finds_one_ulp_and_one_loss(tmp_path):
    _finished_run(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert kill_resume.differences(tmp_path / "a", tmp_path / "b") == []

    model, optimizer = _finished_run(tmp_path / "c")  # the same run, one weight one float step away
    with torch.no_grad():
        model.weight[0, 0] = torch.nextafter(model.weight[0, 0], torch.tensor(1.0))
    save_checkpoint(tmp_path / "c", model, step=2, config={}, optimizer=optimizer)
    found = kill_resume.differences(tmp_path / "a", tmp_path / "c")
    assert len(found) == 1 and "1 of" in found[0] and "model.weight" in found[0]

    (tmp_path / "b" / "history.csv").write_text("step,loss\n1,2.25\n2,2.1875000000000004\n")
    found = kill_resume.differences(tmp_path / "a", tmp_path / "b")
    assert found == [
        "losses differ (2 rows against 2, 1 unequal, first (2, 2.1875000000000004) instead of (2, 2.1875))"
    ]

    _finished_run(tmp_path / "other", seed=1)  # another seed: other weights and optimiser moments
    found = kill_resume.differences(tmp_path / "a", tmp_path / "other")
    assert len(found) == 1 and "tensors differ" in found[0]

    (tmp_path / "b" / "last.safetensors").unlink()
    assert any("last.safetensors unreadable" in f for f in kill_resume.differences(tmp_path / "a", tmp_path / "b"))


def test_a_try_that_is_not_exact_is_counted_and_shown_as_such():
    rows = [
        dict(index=i, signal=s, exit_code=c, checkpoint_before_resume=True, exact=e, differences=d)
        for i, (s, c, e, d) in enumerate(
            [("SIGKILL", -9, True, []), ("SIGINT", 130, False, ["3 of 40 tensors differ"]), ("SIGTERM", 0, True, [])]
        )
    ]
    summary = kill_resume.summarise(rows)
    assert summary["tries"] == 3 and summary["exact"] == 2
    assert summary["stops"]["after_the_run_finished"] == 1 and summary["stops"]["before_any_checkpoint"] == 0
    assert summary["by_signal"]["SIGINT"] == dict(tries=1, exact=0, exit_codes={"130": 1}, checkpoint_before_resume=1)
    line = kill_resume.format_row(
        {**rows[1], "moment": "random", "delay_s": 0.2, "checkpoint_step": 3, "temporaries_left": [],
         "resumes": 1, "resume_stop": None, "fresh_start": False}
    )  # fmt: skip
    assert "NO: 3 of 40 tensors differ" in line
