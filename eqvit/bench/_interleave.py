"""Models trained side by side at equal compute: rounds of step time each, in rotating order."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def train_interleaved(
    runs: list[dict[str, Any]], round_seconds: float, after_round: Callable[[int], None] | None = None
) -> None:
    """Advance every ``run["trainer"]`` (a started :class:`~eqvit.train.engine.Trainer`) by ``round_seconds`` of
    its own step time per round until each is done; the order rotates every round so that load on the machine
    falls on all of them alike. Before each turn the 1-minute load average is appended to ``run["load"]``;
    ``after_round(n)`` is called after round ``n`` (1-based)."""
    done: set[int] = set()
    rounds = 0
    while len(done) < len(runs):
        order = [i for i in range(len(runs)) if i not in done]
        shift = rounds % len(order)
        for i in order[shift:] + order[:shift]:
            run = runs[i]
            run["load"].append(os.getloadavg()[0])
            if run["trainer"].train_for(round_seconds):
                done.add(i)
        rounds += 1
        if after_round is not None:
            after_round(rounds)
