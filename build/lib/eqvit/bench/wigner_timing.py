"""Time the real Wigner-D matrices of eqvit.groups.so3 on a batch of random poses.

Times ``wigner_D_blocks(L, R)`` (the SO(3)-RoPE operator, all degrees at once as one dense block-diagonal
matrix), ``wigner_D_list(L, R)`` (all degrees from the same single pass, one tensor per degree) and
``wigner_D(l, R)`` for each l <= L: warm-up calls first (they also build the cached constants), then
the median and minimum of ``--repeats`` timed calls. Prints a table and writes JSON. Runs on CUDA when
present (``--device`` chooses; each timed call is followed by ``torch.cuda.synchronize``); the Wigner-D
recursion keeps its own float64 internals on every device, ``--dtype`` is the dtype of the poses and the
result.

    python benchmarks/wigner_timing.py                      # 960 float32 poses, L = 7, CUDA if present
    python benchmarks/wigner_timing.py --device cpu         # force the CPU
    python benchmarks/wigner_timing.py --threads 1 --out benchmarks/results/wigner_timing_1thread.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from eqvit.bench import device as _device
from eqvit.bench._paths import display_path, results_dir
from eqvit.groups.so3 import random_rotations, wigner_D, wigner_D_blocks, wigner_D_list

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def time_call(fn: Callable[[], torch.Tensor], repeats: int, warmup: int, device: torch.device) -> dict:
    """Median / min / max wall time in ms of ``fn()`` over ``repeats`` calls after ``warmup`` calls.

    Also the median / min process CPU time: on a shared machine, time spent descheduled inflates the wall
    time but not the CPU time (with one thread and on the CPU the two agree on an idle machine).
    """

    def sync() -> None:
        _device.sync(device)

    for _ in range(warmup):
        fn()
    sync()
    times, cpu_times = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
        cpu_times.append((time.process_time() - cpu_start) * 1e3)
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "cpu_median_ms": statistics.median(cpu_times),
        "cpu_min_ms": min(cpu_times),
    }


def _display_path(path: Path) -> str:
    """``path`` relative to the repository root when inside it (no machine-specific prefixes in JSON)."""
    return display_path(path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=960, help="number of poses (960 = SO3ViT on icosphere level 2)")
    parser.add_argument("--L", type=int, default=7, help="highest degree")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per entry (at least 20)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=results_dir() / "wigner_timing.json", help="JSON path")
    args = parser.parse_args(argv)
    if args.repeats < 20:
        parser.error(f"expected --repeats >= 20, got {args.repeats}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    device = _device.pick_device(args.device)
    args.device = str(device)
    dtype = DTYPES[args.dtype]
    generator = torch.Generator().manual_seed(args.seed)
    R = random_rotations(args.n, generator=generator, dtype=dtype).to(device)

    entries = [
        (f"wigner_D_blocks(L={args.L})", lambda: wigner_D_blocks(args.L, R)),
        (f"wigner_D_list(L={args.L})", lambda: wigner_D_list(args.L, R)),
    ]
    entries += [(f"wigner_D(l={l})", lambda l=l: wigner_D(l, R)) for l in range(args.L + 1)]
    rows = []
    for name, fn in entries:
        stats = time_call(fn, args.repeats, args.warmup, device)
        rows.append({"name": name, **stats, "us_per_pose": 1e3 * stats["median_ms"] / args.n})
    per_l_total = sum(r["median_ms"] for r in rows[2:])

    print(f"{args.n} {args.dtype} poses on {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{'call':<24} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'us/pose':>8} {'cpu med':>8} {'cpu min':>8}")
    for r in rows:
        print(
            f"{r['name']:<24} {r['median_ms']:>10.3f} {r['min_ms']:>8.3f} {r['max_ms']:>8.3f} {r['us_per_pose']:>8.3f}"
            f" {r['cpu_median_ms']:>8.3f} {r['cpu_min_ms']:>8.3f}"
        )
    print(f"{'sum of wigner_D(l)':<24} {per_l_total:>10.3f}")

    result = {
        "benchmark": "wigner_timing",
        "config": {k: (_display_path(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            **_device.device_info(device),
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            # Other work on the machine inflates wall times; the load says how much there was.
            "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
        "results": rows,
        "sum_wigner_D_per_l_median_ms": per_l_total,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
