"""The model zoo as a table, generated from the registry (``eqvit zoo``; ``eqvit zoo --markdown`` is the README's
model table)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eqvit.models._registry import create_model, list_models

# Registered-name prefix -> family shown in the table.
FAMILIES = {
    "so3vit": "SO3ViT (SO(3)-RoPE)",
    "o2vit": "O(2)-subgroup ViT",
    "platonic": "Platonic Transformer",
    "dip": "DiP (Platonic diffusion denoiser)",
    "s2transformer": "baseline: S2Transformer",
    "vit_ape": "baseline: ViT + learned APE",
}


@dataclass(frozen=True)
class ZooRow:
    name: str
    family: str
    group: str
    params: int
    input: str


def family_of(name: str) -> str:
    return next((family for prefix, family in FAMILIES.items() if name.startswith(prefix)), "other")


def zoo_rows(pattern: str = "*") -> list[ZooRow]:
    """One row per registered model matching ``pattern`` (each model is built once, on the CPU)."""
    rows = []
    for name in list_models(pattern):
        with torch.device("cpu"):
            model = create_model(name)
        group = getattr(model, "group", None)
        frames = getattr(model, "frames", None)
        group_text = "none" if group is None else f"{group.name} ({group.order})"
        if frames is not None and frames is not group:
            group_text += f", frames {frames.name}"
        domain = getattr(model, "domain", None)
        rows.append(
            ZooRow(
                name=name,
                family=family_of(name),
                group=group_text,
                params=sum(p.numel() for p in model.parameters()),
                input=domain.describe_input(model.in_chans) if domain is not None else "?",
            )
        )
        del model
    return rows


def format_count(n: int) -> str:
    """``1234 -> 1.2k``, ``2_500_000 -> 2.50M``."""
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{n / 1e3:.1f}k"


def zoo_text(rows: list[ZooRow]) -> str:
    """An aligned plain-text table: name, family, group (order), parameters, input layout."""
    table = [("model", "family", "equivariant to", "params", "input")]
    table += [(r.name, r.family, r.group, format_count(r.params), r.input) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4] for row in table)


def zoo_markdown(rows: list[ZooRow]) -> str:
    """A GitHub-markdown table: name, family, group (order), parameters, input layout."""
    lines = ["| model | family | equivariant to | params | input |", "|---|---|---|---:|---|"]
    for row in rows:
        lines.append(f"| `{row.name}` | {row.family} | {row.group} | {format_count(row.params)} | {row.input} |")
    return "\n".join(lines)
