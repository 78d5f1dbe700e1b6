"""``eqvit.fold`` against the training form, for every registered model (or the ones named).

Each model is built, its parameters noised (:func:`eqvit.testing.randomise_parameters_`: a fresh
model's zero-initialised head would make any agreement trivial), cast to float64 (float32 for the
S2Transformer baselines: torch-harmonics' DISCO convolution computes in float32 whatever the model's
dtype), and run in ``eval()`` on one random input from its domain, before and after
:func:`eqvit.fold`. The figure is the maximum absolute difference of the outputs over the maximum
absolute output (the one-ViT issue's bound: 1e-10 in float64).

Writes JSON and prints a row per model.

Usage: ``python benchmarks/fold_agreement.py [--models NAME ...] [--tiny] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import eqvit
from eqvit.bench._paths import results_dir
from eqvit.testing import randomise_parameters_

FLOAT32_ONLY = ("s2transformer",)  # DISCO convolutions compute in float32


def agreement(name: str, seed: int = 0) -> dict:
    """One row: the relative difference between ``model(x)`` and ``eqvit.fold(model)(x)``."""
    dtype = torch.float32 if name.startswith(FLOAT32_ONLY) else torch.float64
    torch.manual_seed(seed)
    model = randomise_parameters_(eqvit.create_model(name), seed).to(dtype).eval()
    gen = torch.Generator().manual_seed(seed)
    x = model.domain.random_input(1, model.in_chans, generator=gen, dtype=dtype)
    inputs = x if isinstance(x, tuple) else (x,)
    start = time.perf_counter()
    with torch.no_grad():
        expected = model(*inputs)
        got = eqvit.fold(model)(*inputs)
    error = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-300))
    return dict(model=name, dtype=str(dtype).removeprefix("torch."), relative_error=error,
                params=sum(p.numel() for p in model.parameters()), seconds=time.perf_counter() - start)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", help="registered names (default: every registered model)")
    parser.add_argument("--tiny", action="store_true", help="only the *_tiny twins (seconds, not minutes)")
    parser.add_argument("--out", default=str(results_dir() / "fold_agreement.json"))
    args = parser.parse_args(argv)
    names = args.models or eqvit.list_models()
    unknown = sorted(set(names) - set(eqvit.list_models()))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; `eqvit list` names the registered ones")
    if args.tiny:
        names = [n for n in names if n.endswith("_tiny")]
    rows = []
    print(f"{'model':<36} {'dtype':<8} {'params':>11} {'folded vs training form':>23}")
    for name in sorted(names):
        row = agreement(name)
        rows.append(row)
        print(f"{name:<36} {row['dtype']:<8} {row['params']:>11,} {row['relative_error']:>23.1e}", flush=True)
    worst = max((r["relative_error"] for r in rows if r["dtype"] == "float64"), default=float("nan"))
    print(f"\n{len(rows)} models, worst float64 relative difference {worst:.1e} (bound 1e-10)")
    meta = dict(torch=torch.__version__, platform=platform.platform())
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows, worst_float64=worst), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
