"""The ablation driver's bookkeeping: cells that resume, reports redrawn from committed cells alone."""

from __future__ import annotations

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def ablate():
    from eqvit.bench import ablate

    return ablate


def test_cell_store_persists_and_resumes(ablate, tmp_path):
    store = ablate.CellStore(tmp_path)
    assert not store.done("a")
    store.put("a", {"acc": 0.5})
    assert store.done("a") and not list((tmp_path / "cells").glob("*.tmp"))
    again = ablate.CellStore(tmp_path)
    assert again.done("a") and again.cells["a"] == {"acc": 0.5} and not again.done("b")


def fake_swe_cells(ablate, store, with_maps: bool) -> None:
    """Training and speed cells for every sphere model, with made-up numbers."""
    rng = np.random.default_rng(0)
    speed = {}
    for i, label in enumerate(ablate.SWE_MODELS):
        metrics = {"rel_l2": 0.1 + 0.1 * i, "rel_l1": 0.1 + 0.1 * i, "polar_error_ratio": 1.0 + 0.01 * i}
        store.put(
            f"train-{ablate.slug(label)}",
            {
                "label": label,
                "model": ablate.SWE_MODELS[label][0],
                "params": 800_000 + i,
                "steps": 100 * (i + 1),
                "seconds_per_step": 0.5 * (i + 1),
                "metrics": metrics,
                "persistence": metrics | {"rel_l2": 1.2},
            },
        )
        speed[label] = {"forward_ms": 10.0 * (i + 1), "peak_train_mb": None if i == 0 else 100.0 * i}
        if with_maps:
            from eqvit.train.rollout import save_maps

            np.save(ablate.error_map_path(store, label), rng.random(10 * 4**2 + 2).astype(np.float32))
            steps = [
                dict(step=k, lead_hours=float(k), rel_l1=0.1 * k, rel_l2=0.1 * k, persistence_rel_l1=1.0,
                     persistence_rel_l2=1.0, polar_error_ratio=1.0, persistence_polar_error_ratio=1.0)
                for k in (1, 2)
            ]  # fmt: skip
            store.cells[f"train-{ablate.slug(label)}"]["rollout"] = dict(
                num_steps=2, dt_hours=1.0, num_initial_conditions=2, first_nonfinite_step=None, steps=steps
            )
            maps = {k: (rng.random(162), rng.random(162)) for k in (1, 2)}
            save_maps({"maps": maps}, ablate.rollout_maps_path(store, label))
    store.put("speed", speed)


@pytest.mark.parametrize("with_maps", [True, False])
def test_swe_report_redraws_from_cells_without_checkpoints(ablate, tmp_path, with_maps):
    store = ablate.CellStore(tmp_path)
    fake_swe_cells(ablate, store, with_maps)
    report = ablate.swe_report(ablate.SWE_MODELS, None, store, minutes=10)
    table = report["table"].splitlines()
    assert len(table) == 4 + len(ablate.SWE_MODELS) + 1  # title, blank, header, rule, models, persistence
    assert "| SO3ViT (SO(3)-RoPE) | 0.800M | 100 | 0.50 | 0.1000 |" in table[4] and table[4].endswith("| - |")
    assert table[-1].startswith("| persistence |")
    assert not (tmp_path / "runs").exists()
    assert (tmp_path / "pareto_l2_vs_time.png").stat().st_size > 0
    assert (tmp_path / "error_maps.png").exists() == with_maps  # a missing map skips the figure, no crash
    assert (tmp_path / "rollout.png").exists() == with_maps  # every model's rollout curves and maps


def test_main_keeps_a_history_of_invocations(ablate, tmp_path, monkeypatch, capsys):
    def fake_task(args, store):
        key = f"cell{len(store.cells)}"
        if args.minutes:  # "train" one more cell; without --minutes only redraw the report
            store.put(key, {"x": 1})
        return {"rows": [], "table": "| t |", "plots": []}

    monkeypatch.setitem(ablate.TASKS, "points", fake_task)
    ablate.main(["points", "--out", str(tmp_path), "--minutes", "1"])
    ablate.main(["points", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "points" / "results.json").read_text())
    runs = result["invocations"]
    assert [r["cells_added"] for r in runs] == [["cell0"], []]
    assert all(r["wall_minutes"] >= 0 and r["machine"]["cpu_count"] >= 1 for r in runs)
    assert "resuming: 1 finished cells" in capsys.readouterr().out


def test_past_invocations_reads_results_written_before_the_history(ablate, tmp_path):
    assert ablate.past_invocations(tmp_path) == []
    legacy = {"machine": {"time": "2026-11-30 20:01:01"}, "wall_minutes": 9.6}
    (tmp_path / "results.json").write_text(json.dumps(legacy))
    assert ablate.past_invocations(tmp_path) == [
        {"machine": {"time": "2026-11-30 20:01:01"}, "wall_minutes": 9.6, "cells_added": None}
    ]
