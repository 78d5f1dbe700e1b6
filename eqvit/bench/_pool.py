"""The process pool the benchmarks train their cells in."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def process_pool(jobs: int) -> ProcessPoolExecutor:
    """``jobs`` worker processes started fresh ("spawn"): a forked worker of a process that has already run
    autograd (a test session, a notebook) cannot run a backward pass, and spawn behaves the same everywhere."""
    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
