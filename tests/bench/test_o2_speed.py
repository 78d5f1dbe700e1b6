"""The O(2) seed-width benchmark (:mod:`eqvit.bench.o2_speed`): its rows, and the compiled pair."""

from __future__ import annotations

import json

from eqvit.bench import o2_speed


def test_compiled_rows_are_timed_against_compiled_timm(tmp_path, capsys):
    out = tmp_path / "o2.json"
    o2_speed.main(["--batches", "1", "--threads", "1", "--repeats", "2", "--compile", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    models = row["models"]
    assert set(models) == {*o2_speed.MODELS, "o2vit_D4_coupled[compiled]", "timm_vit[compiled]"}
    assert models["timm_vit"]["ratio_to_timm"] == 1.0 and models["timm_vit[compiled]"]["ratio_to_timm"] == 1.0
    compiled = models["o2vit_D4_coupled[compiled]"]
    eager = models["o2vit_D4_coupled"]
    # the compiled row's ratio is over compiled timm, and its shapes and counts are the model's own
    assert (
        compiled["ratio_to_timm"] == compiled["forward_ms_median"] / models["timm_vit[compiled]"]["forward_ms_median"]
    )
    assert compiled["params"] == eager["params"] and compiled["feature_type"] == eager["feature_type"]
    assert "o2vit_D4_coupled[compiled]" in capsys.readouterr().out
