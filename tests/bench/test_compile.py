"""``benchmarks/compile.py``: one row per model and form, with graph breaks, timings and the compiled output's
difference from eager (run here with the ``aot_eager`` backend, which traces as Inductor does without its
code generation)."""

from __future__ import annotations

import json

import pytest

from eqvit.bench import compile as compile_bench


def test_rows_report_breaks_times_and_agreement(tmp_path):
    out = tmp_path / "compile.json"
    result = compile_bench.main(
        ["--names", "o2vit_square_tiny", "--rounds", "1", "--backend", "aot_eager", "--out", str(out)]
    )
    assert json.loads(out.read_text()) == result
    rows = {row["form"]: row for row in result["rows"]}
    assert set(rows) == {"train", "folded"}
    for row in rows.values():
        assert row["graph_breaks"] == 0 and "error" not in row
        assert row["eager_ms"] > 0 and row["compiled_ms"] > 0 and row["first_call_s"] > 0
        assert row["max_abs_diff"] < 1e-4 and len(row["load"]) == 2


def test_a_graph_break_is_reported_in_its_row(monkeypatch):
    """fullgraph=True refuses a model that leaves the graph; the row names the error and the break count."""
    import torch

    def breaking_model(name):
        model = compile_bench.eqvit.create_model(name)
        forward = model.head.forward  # the head: a fold keeps it (the blocks of a folded stream are new)

        def leave_graph(*args, **kwargs):
            torch._dynamo.graph_break()
            return forward(*args, **kwargs)

        model.head.forward = leave_graph
        return model

    monkeypatch.setattr(compile_bench, "_build", breaking_model)
    row = compile_bench.measure("o2vit_square_tiny", "folded", 1, 1, "aot_eager")
    assert row["graph_breaks"] >= 1 and "error" in row


def test_family_models_cover_every_family():
    names = compile_bench.family_models()
    assert "so3vit_tiny" in names and "platonic_qm9_tiny" in names
    assert set(names) <= set(compile_bench.eqvit.list_models()) and len(names) == len(set(names))


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--names", "not_a_model"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as exit_info:
        compile_bench.main(argv)
    assert exit_info.value.code == 2
