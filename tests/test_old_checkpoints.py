"""Checkpoints written before the one-ViT redesign (commit 4ae8ffb) still load and compute the same function.

``tests/data/pre_redesign/NAME.safetensors`` holds, from the old code: the state dict of ``NAME``
(its tiny default, parameters noised so that no part is zero), a float64 input and the old model's
float64 output on it. A change of parameter layout or meaning (e.g. the order of the irrep
coordinates, a reparametrised linear) makes the strict load or the comparison fail.

The hex fixture's output was recomputed on 2026-12-02 by the old code (4ae8ffb) from the same
state dict, in the environment ``make test`` builds (numpy 1.26, which escnn's oracle extra pins):
its invariant APE basis is an ``eigh`` eigenbasis of a degenerate eigenspace, so the old code's
output on the same parameters differs (2e-2) between numpy/LAPACK builds. The new code matches the
old code to round-off in the same environment.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import eqvit

DATA = Path(__file__).parent / "data" / "pre_redesign"
NAMES = sorted(p.stem for p in DATA.glob("*.safetensors"))


def test_the_fixtures_are_there():
    assert {"o2vit_square_tiny", "o2vit_hex_tiny", "platonic_image_tiny", "so3vit_tiny"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_old_checkpoint_loads_and_computes_the_same_function(name):
    stored = load_file(DATA / f"{name}.safetensors")
    state = {k.removeprefix("state."): v for k, v in stored.items() if k.startswith("state.")}
    model = eqvit.create_model(name)
    model.load_state_dict(state, strict=True)
    model = model.double().eval()
    with torch.no_grad():
        out = model(stored["input"])
    expected = stored["output"]
    assert ((out - expected).abs().max() / expected.abs().max()).item() <= 1e-10
