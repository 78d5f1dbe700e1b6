"""docs/benchmarks.md is the page the canonical results give (benchmarks/report.py)."""

from __future__ import annotations

import json

from eqvit.bench import report


def test_the_benchmarks_page_matches_the_results(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().err


def test_every_section_renders_and_check_fails_on_a_stale_page(tmp_path, capsys):
    page = report.render()
    for section in report.SECTIONS:
        assert f"## {section.title}" in page
        assert f"`{section.command}`" in page
    stale = tmp_path / "benchmarks.md"
    stale.write_text(page.replace("| 0 |", "| 1 |", 1))
    assert report.main(["--check", "--out", str(stale)]) == 1
    assert "is not the page the results give" in capsys.readouterr().err


def test_load_and_machine_are_read_wherever_a_result_keeps_them():
    data = {"meta": {"torch": "2.14", "threads": 1}, "rows": [{"load": [0.7, 0.9]}, {"loadavg": [1.4, 1.2]}]}
    assert report.load_range(data) == "0.7-1.4"
    assert report.machine_of(data) == "torch 2.14; threads 1"
    assert report.load_range(json.loads("{}")) == "not recorded"
    assert report.load_range([{"load_avg_1min_train": {"mean": 2.0, "max": 3.5}}]) == "2.0-3.5"
