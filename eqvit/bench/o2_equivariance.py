"""Invariance and restriction errors of the O(2)-subgroup ViTs, every group and both attention layouts.

For each group of the square family (D4, C4, D2, C2, D1, C1) and of the hexagonal family (D6, C6, D3,
C3, D2, C2, D1, C1) and for coupled and irrep-wise attention, the ``*_tiny`` model is cast to float64,
its parameters get Gaussian noise (timm's small init would leave paths nearly silent, and a silent
model is trivially invariant), and :func:`eqvit.testing.assert_equivariant` compares the logits of
``g . x`` and ``x`` for every element g, with the action derived from ``model.domain.points``.
Then the D4 and D6 models are restricted to every subgroup named in their family
(:func:`eqvit.restrict`, Theorem 2): the restricted model's logits against the parent's, and the
restricted model's own invariance under the subgroup.

Writes JSON and prints the maximum relative error per row (the bound is 1e-9).

Usage: ``python benchmarks/o2_equivariance.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

import eqvit
from eqvit.bench._paths import results_dir
from eqvit.nn.tokenizers.hexagonal import HEX_GROUPS
from eqvit.nn.tokenizers.square import SQUARE_GROUPS
from eqvit.testing import assert_equivariant, randomise_parameters_

FAMILIES = {"square": ("o2vit_square_tiny", SQUARE_GROUPS), "hex": ("o2vit_hex_tiny", HEX_GROUPS)}
# The hexagonal family on its own grid (img_size=None): equivariant to all of D6, not only to the elements
# that map a square image onto itself.
BUILD = {"square": {}, "hex": {"img_size": None}}
LAYOUTS = ("coupled", "irrepwise")


def noisy_model(name: str, group: str, attention: str, seed: int = 0, **kwargs) -> torch.nn.Module:
    """The float64 model with N(0, 1/fan_in) noise on matrices and N(0, 0.01) on vectors."""
    torch.manual_seed(seed)
    model = eqvit.create_model(name, group=group, attention=attention, **kwargs).double().eval()
    return randomise_parameters_(model, seed)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(results_dir() / "o2_equivariance.json"))
    args = parser.parse_args()
    start = time.perf_counter()
    invariance, restriction = [], []
    print(f"{'grid':<7} {'group':<5} {'layout':<10} {'max rel. invariance error':>26}")
    for grid, (name, groups) in FAMILIES.items():
        for group in groups:
            for attention in LAYOUTS:
                model = noisy_model(name, group, attention, **BUILD[grid])
                report = assert_equivariant(model, tolerance=float("inf"))
                invariance.append(
                    dict(grid=grid, group=group, attention=attention, elements=len(report.rows),
                         max_relative_error=report.max_relative_error)
                )  # fmt: skip
                print(f"{grid:<7} {group:<5} {attention:<10} {report.max_relative_error:>26.2e}")
    print(f"\n{'grid':<7} {'G':<3} {'H':<3} {'layout':<10} {'logits vs G-model':>18} {'H-invariance':>13}")
    for grid, (name, groups) in FAMILIES.items():
        parent = groups[0]
        for attention in LAYOUTS:
            model = noisy_model(name, parent, attention, **BUILD[grid])
            x = model.domain.random_input(2, model.in_chans).double()
            for sub in groups[1:]:
                restricted = eqvit.restrict(model, sub)
                with torch.no_grad():
                    same = relative_error(restricted(x), model(x))
                own = assert_equivariant(restricted, tolerance=float("inf")).max_relative_error
                restriction.append(
                    dict(grid=grid, group=parent, subgroup=sub, attention=attention,
                         logits_relative_error=same, subgroup_invariance_error=own)
                )  # fmt: skip
                print(f"{grid:<7} {parent:<3} {sub:<3} {attention:<10} {same:>18.2e} {own:>13.2e}")
    worst_inv = max(r["max_relative_error"] for r in invariance)
    worst_res = max(max(r["logits_relative_error"], r["subgroup_invariance_error"]) for r in restriction)
    print(f"\nworst invariance error {worst_inv:.2e}, worst restriction error {worst_res:.2e}")
    meta = dict(torch=torch.__version__, platform=platform.platform(), seconds=time.perf_counter() - start)
    Path(args.out).write_text(
        json.dumps(dict(meta=meta, invariance=invariance, restriction=restriction,
                        worst_invariance_error=worst_inv, worst_restriction_error=worst_res), indent=2)
    )  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
