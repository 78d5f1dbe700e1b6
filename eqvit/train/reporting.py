"""The report of a training run against its task's baseline: one implementation for every task.

A task names its baseline (``baseline_name``: persistence, the majority class, ...), the metric it is
judged by (``monitor``, better ``"min"`` or ``"max"``: ``monitor_mode``), a label for that metric and the
columns of its table; :class:`MetricReport` turns them into the run's summary entry, the final table and the
one-line verdict the engine prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Column:
    """One column of a report table: ``metrics[key] * scale`` formatted with ``fmt`` (``"-"`` when absent)."""

    key: str
    label: str
    fmt: str = ".4f"
    scale: float = 1.0
    suffix: str = ""

    @property
    def width(self) -> int:
        return max(len(self.label), 9)

    def cell(self, metrics: dict[str, Any]) -> str:
        value = metrics.get(self.key)
        text = "-" if value is None else f"{value * self.scale:{self.fmt}}{self.suffix}"
        return text.rjust(self.width)


class MetricReport:
    """``summary``, ``table`` and ``verdict`` from the task's ``baseline_name``, ``monitor`` /
    ``monitor_mode``, ``headline_label`` (what the verdict calls the monitored metric) and ``report_columns``.

    Tasks inherit it; a task adds entries of its own to the summary with :meth:`summary_extras`.
    """

    baseline_name: str
    monitor: str
    monitor_mode: str  # "min" | "max"
    headline_label: str
    report_columns: tuple[Column, ...]

    @property
    def beats_key(self) -> str:
        """The summary entry that says whether the model beats the baseline."""
        return f"beats_{self.baseline_name}"

    def summary_extras(self, final: dict[str, Any]) -> dict[str, Any]:
        """Entries the task adds to the run's summary (default: none)."""
        return {}

    def summary(self, final: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
        """``{beats_<baseline>: bool, **summary_extras(final)}``; a NaN metric beats nothing."""
        ours, theirs = final[self.monitor], baseline[self.monitor]
        better = ours > theirs if self.monitor_mode == "max" else ours < theirs
        return {self.beats_key: bool(better and not math.isnan(ours)), **self.summary_extras(final)}

    def table(self, rows: list[tuple[str, dict[str, Any]]]) -> str:
        """One line per ``(name, metrics)`` under a header of the column labels."""
        lines = [f"{'':<22}" + "".join(f" {c.label:>{c.width}}" for c in self.report_columns)]
        lines += [f"{name:<22}" + "".join(f" {c.cell(m)}" for c in self.report_columns) for name, m in rows]
        return "\n".join(lines)

    def verdict(self, summary: dict[str, Any]) -> str:
        word = "beats" if summary[self.beats_key] else "does NOT beat"
        baseline = self.baseline_name.replace("_", " ")
        return f"{summary['model']} {word} the {baseline} baseline in {self.headline_label}."
