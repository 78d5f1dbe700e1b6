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


def test_in_place_and_out_ops_on_existing_tensors_are_no_allocation() -> None:
    """An optimizer updates parameters and its state in place: those storages existed before the call."""
    from eqvit.bench._memory import peak_allocated_mb

    existing, other = torch.zeros(2**18), torch.ones(2**18)  # 1 MiB each, allocated before the call

    def update() -> None:
        existing.mul_(0.5).add_(other)
        torch.add(existing, other, out=existing)
        torch._foreach_mul_([existing, other], 2.0)
        torch.empty(2**17)  # 0.5 MiB: the only allocation

    assert abs(peak_allocated_mb(update) - 0.5) < 1e-6
