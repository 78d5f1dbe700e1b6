"""Every registered model pickles whole and deep-copies, in its training form and in ``eqvit.fold``'s,
and ``eqvit.fold`` folds bf16 / fp16 models.

``torch.save(model)`` stores modules by value: the groups inside (built-in ones by name, so that the
unpickled model shares the cached group), the domains (without their per-instance caches) and
torch-harmonics' attention kernel (a registered custom op, by the name it is defined under).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from helpers import TEST_MODELS, build, call, random_input, randomise_

import eqvit
from eqvit.groups import get_group


def roundtrip(model: torch.nn.Module) -> torch.nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("form", ["train", "folded"])
@pytest.mark.parametrize("name", TEST_MODELS)
def test_every_model_pickles_and_deep_copies(name, form):
    model = build(name)
    randomise_(model)
    model = eqvit.fold(model) if form == "folded" else model.eval()
    x = random_input(model)
    with torch.no_grad():
        expected = call(model, x)
        for clone in (roundtrip(model), copy.deepcopy(model)):
            assert type(clone) is type(model)
            assert torch.equal(call(clone.eval(), x), expected)


def test_an_unpickled_model_shares_the_cached_group():
    model = roundtrip(eqvit.create_model("o2vit_square_tiny"))
    assert model.group is get_group("D4")


def test_a_subgroup_and_a_registered_group_travel_by_value():
    group = get_group("D4")
    sub = group.subgroup(group.subgroups()[2])
    clone = pickle_roundtrip(sub)
    assert clone is not sub and clone.name == sub.name
    assert (clone.cayley == sub.cayley).all()
    assert [r.name for r in clone.irreps] == [r.name for r in sub.irreps]


def pickle_roundtrip(obj):
    import pickle

    return pickle.loads(pickle.dumps(obj))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", TEST_MODELS)
def test_fold_folds_half_precision_models(name, dtype):
    """A trained (randomised) model cast to bf16 / fp16 folds, and computes what it computed before folding."""
    model = build(name)
    randomise_(model)
    model = model.to(dtype).eval()
    folded = eqvit.fold(model)
    assert all(p.dtype == dtype for p in folded.parameters())
    x = random_input(model, dtype=dtype)
    with torch.no_grad():
        try:
            expected = call(model, x).float()
        except RuntimeError as err:  # torch-harmonics' SHT keeps float32 buffers: no half-precision forward
            pytest.skip(f"{name} does not run in {dtype} unfolded either ({err})")
        got = call(folded, x).float()
    scale = expected.abs().max().clamp_min(1e-6)
    assert ((got - expected).abs().max() / scale).item() < 0.05
