"""Checkpoints written before the one-ViT redesign (commit 4ae8ffb) still load and compute the same function.

``tests/data/pre_redesign/NAME.safetensors`` holds, from the old code: the state dict of ``NAME``
(its tiny default, parameters noised so that no part is zero), a float64 input and the old model's
float64 output on it. A change of parameter layout or meaning (e.g. the order of the irrep
coordinates, a reparametrised linear) makes the strict load or the comparison fail.

The hex fixture's output was recomputed on 2026-12-02 by the old code (4ae8ffb) from the same
state dict, in the environment ``make test`` builds (numpy 1.26, which escnn's oracle extra pins).
The fixtures predate ``basis_version``: their invariant APE coefficients are coordinates in the
old code's ``eigh`` eigenbasis of a degenerate eigenspace, which differs between numpy/LAPACK builds
(the hex fixture's output by 2e-2). ``legacy_ape_bases.json`` records that basis of the build that
computed the outputs, relative to the canonical basis; the load below converts the coefficients
from it, through the same code path that converts from this build's ``eigh`` basis otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import eqvit
from eqvit.nn.posenc import invariant
from eqvit.nn.posenc.invariant import invariant_basis, legacy_invariant_basis
from eqvit.nn.tokenizers.icosphere import IcosphereUnpatchify

DATA = Path(__file__).parent / "data" / "pre_redesign"
NAMES = sorted(p.stem for p in DATA.glob("*.safetensors"))
WRITER_BASES = json.loads((DATA / "legacy_ape_bases.json").read_text())["bases"]


def test_the_fixtures_are_there():
    assert {"o2vit_square_tiny", "o2vit_hex_tiny", "platonic_image_tiny", "so3vit_tiny"} <= set(NAMES)
    assert set(WRITER_BASES) == {"o2vit_square_tiny", "o2vit_hex_tiny"}


def _load(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture's model (its legacy state loaded strictly, float64, eval) and the stored tensors."""
    stored = load_file(DATA / f"{name}.safetensors")
    state = {k.removeprefix("state."): v for k, v in stored.items() if k.startswith("state.")}
    assert not any(k.endswith("basis_version") for k in state)  # the fixtures predate it
    model = eqvit.create_model(name)
    model.load_state_dict(state, strict=True)
    model = model.double().eval()
    # The old unpatchify divided by 1 / count rounded to float32 in every dtype (3e-8 relative in float64);
    # it is exact since 2026-12-03. Rounded as the old code rounded it, the rest must match to 1e-10.
    for module in model.modules():
        if isinstance(module, IcosphereUnpatchify):
            module.inv_count.copy_(module.inv_count.float())
    return model, stored


def _relative_error(model: torch.nn.Module, stored: dict[str, torch.Tensor]) -> float:
    with torch.no_grad():
        out = model(stored["input"])
    expected = stored["output"]
    return ((out - expected).abs().max() / expected.abs().max()).item()


def _writers_legacy_basis(name: str, monkeypatch) -> list[np.ndarray]:
    """Make the legacy basis the recorded one of the build that wrote ``name``; returns the unused records."""
    pending = [np.array(t, dtype=np.float64) for t in WRITER_BASES[name]]

    def writers(perms: np.ndarray, matrices: np.ndarray) -> np.ndarray:
        return np.einsum("ij,jmd->imd", pending.pop(0), invariant_basis(perms, matrices))

    monkeypatch.setattr(invariant, "legacy_invariant_basis", writers)
    return pending


@pytest.mark.filterwarnings("ignore:.*no basis_version")
@pytest.mark.parametrize("name", NAMES)
def test_old_checkpoint_loads_and_computes_the_same_function(name, monkeypatch):
    pending = _writers_legacy_basis(name, monkeypatch) if name in WRITER_BASES else []
    model, stored = _load(name)
    assert not pending, "every invariant APE block is converted once"
    assert _relative_error(model, stored) <= 1e-10


@pytest.mark.parametrize("name", sorted(WRITER_BASES))
def test_in_this_build_the_legacy_load_warns_and_is_exact_iff_eigh_gives_the_writers_basis(name):
    """Unpatched, the coefficients are read in this build's eigh basis: the function is the old one
    exactly when that is the writer's basis (the warning's caveat), and the warning always comes."""
    with pytest.warns(UserWarning, match="no basis_version in the state dict"):
        model, stored = _load(name)
    ape = model.posenc
    blocks = ape.ftype.blocks()
    same = True
    for (n, _, _), recorded in zip(ape._used, WRITER_BASES[name], strict=True):
        here = legacy_invariant_basis(ape._perms, blocks[n][1].matrices).reshape(len(recorded), -1)
        canonical = ape._exact_masters[f"basis_{n}"].numpy().reshape(len(recorded), -1)
        same &= np.allclose(here @ canonical.T, recorded, atol=1e-9)
    assert (_relative_error(model, stored) <= 1e-10) == same
