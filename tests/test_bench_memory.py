"""eqvit.bench._memory: peak allocated tensor memory of a call."""

from __future__ import annotations

import torch


def test_peak_allocated_counts_what_a_call_holds() -> None:
    from eqvit.bench._memory import peak_allocated_mb

    def two_at_once() -> None:
        a = torch.empty(2**18)  # 1 MiB
        b = torch.empty(2**18)
        del a, b

    def one_at_a_time() -> None:
        for _ in range(3):
            torch.empty(2**18)

    assert abs(peak_allocated_mb(two_at_once) - 2.0) < 1e-6
    assert abs(peak_allocated_mb(one_at_a_time) - 1.0) < 1e-6
