"""The model-zoo table is generated from the registry."""

from __future__ import annotations

import eqvit
from eqvit.models.zoo import format_count, zoo_markdown, zoo_rows


def test_zoo_has_one_row_per_registered_model_with_its_group_and_input():
    rows = zoo_rows("*tiny")
    assert [r.name for r in rows] == eqvit.list_models("*tiny")
    by_name = {r.name: r for r in rows}
    assert by_name["so3vit_tiny"].group == "I (60)"
    assert by_name["so3vit_tiny"].input == "[B, 3, 642] on icosphere level 3"
    assert by_name["platonic_points_tiny"].input.startswith("pos [B, N, 3], feat [B, N, 1]")
    assert by_name["vit_ape_tiny"].group == "none"
    model = eqvit.create_model("o2vit_square_tiny")
    assert by_name["o2vit_square_tiny"].params == sum(p.numel() for p in model.parameters())
    table = zoo_markdown(rows).splitlines()
    assert table[0].startswith("| model |") and len(table) == 2 + len(rows)


def test_format_count():
    assert format_count(1234) == "1.2k" and format_count(2_500_000) == "2.50M"


def test_cli_zoo_prints_the_table(capsys):
    from eqvit.cli import main

    names = eqvit.list_models("platonic*tiny")
    assert main(["zoo", "platonic*tiny", "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| model |") and len(out) == 2 + len(names)
    assert main(["zoo", "platonic*tiny"]) == 0  # aligned text: a header, then one row per model
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["model", "family"] and len(out) == 1 + len(names)
    assert all(line.startswith(name) for line, name in zip(out[1:], names))
