"""``eqvit bench fold_agreement``: the figure it reports is the folded model's difference, and it can fail."""

from __future__ import annotations

import copy
import json

import pytest

import eqvit
from eqvit import bench
from eqvit.bench import fold_agreement
from eqvit.testing import randomise_parameters_


def test_writes_one_row_per_model(tmp_path, capsys):
    out = tmp_path / "fold.json"
    bench.run("fold_agreement", ["--models", "o2vit_square_tiny", "so3vit_tiny", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["model"] for r in result["rows"]] == ["o2vit_square_tiny", "so3vit_tiny"]
    assert all(r["dtype"] == "float64" and r["relative_error"] <= 1e-10 for r in result["rows"])
    assert "worst float64" in capsys.readouterr().out


def test_a_fold_that_changes_the_function_is_reported(monkeypatch):
    def broken_fold(model):
        return randomise_parameters_(copy.deepcopy(model), seed=1)  # other weights: another function

    monkeypatch.setattr(eqvit, "fold", broken_fold)
    assert fold_agreement.agreement("o2vit_square_tiny")["relative_error"] > 1e-3


def test_unknown_model_is_a_usage_error():
    with pytest.raises(SystemExit) as exc:
        bench.run("fold_agreement", ["--models", "not_a_model"])
    assert exc.value.code == 2
