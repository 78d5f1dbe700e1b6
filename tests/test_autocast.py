"""Mixed precision: every registered tiny model runs under CPU bf16 autocast, forward and backward, and
the parameter-derived caches (:class:`~eqvit.nn.buffers.DerivedCache`) never hand a value computed
under one autocast state to a forward in another (issue 19, part 3, faults 6 and 7)."""

from __future__ import annotations

import copy

import pytest
import torch
from randomise import randomise_
from torch import nn

import eqvit
from eqvit.nn.buffers import DerivedCache

TINY = eqvit.list_models("*tiny")


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return randomise_(eqvit.create_model(name)).eval()


def _input(model: nn.Module, batch: int = 2):
    gen = torch.Generator().manual_seed(0)
    return model.domain.random_input(batch, model.in_chans, generator=gen, dtype=torch.float32)


def _call(model: nn.Module, x):
    return model(*x) if isinstance(x, tuple) else model(x)


def _autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _uses_cache(model: nn.Module) -> bool:
    return any(isinstance(m, DerivedCache) for m in model.modules())


def test_tiny_models_using_the_cache_exist():
    """The O(2) and Platonic families fold weights through DerivedCache: the tests below cover them."""
    users = [name for name in TINY if _uses_cache(_model(name))]
    assert {"o2vit_square_tiny", "o2vit_hex_tiny", "platonic_image_tiny"} <= set(users)


@pytest.mark.parametrize("name", TINY)
def test_fp32_after_autocast_equals_fresh_fp32(name):
    model = _model(name)
    fresh = copy.deepcopy(model)
    x = _input(model)
    with torch.no_grad():
        expected = _call(fresh, x)
        with _autocast():
            _call(model, x)  # fills the caches with values computed under autocast
        got = _call(model, x)
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", TINY)
def test_autocast_after_fp32_equals_fresh_autocast(name):
    model = _model(name)
    fresh = copy.deepcopy(model)
    x = _input(model)
    with torch.no_grad():
        reference = _call(model, x)  # fills the caches with fp32 values
        with _autocast():
            expected = _call(fresh, x)
            got = _call(model, x)
    assert torch.equal(got, expected)
    scale = reference.abs().max()
    assert (got.float() - reference).abs().max() <= 0.1 * scale  # bf16-close to the fp32 forward


@pytest.mark.parametrize("name", TINY)
def test_autocast_inference_mode_then_fp32(name):
    model = _model(name)
    fresh = copy.deepcopy(model)
    x = _input(model)
    with torch.inference_mode():
        expected = _call(fresh, x)
        with _autocast():
            _call(model, x)
        assert torch.equal(_call(model, x), expected)


def test_cache_with_inference_tensors():
    """A model copied under inference_mode has inference-tensor parameters (no version counter)."""
    model = _model("o2vit_square_tiny")
    x = _input(model)
    with torch.no_grad():
        expected = _call(model, x)
    with torch.inference_mode():
        clone = copy.deepcopy(model)
        assert torch.equal(_call(clone, x), expected) and torch.equal(_call(clone, x), expected)


@pytest.mark.parametrize("name", TINY)
def test_forward_backward_under_autocast(name):
    model = _model(name).train()
    x = _input(model)
    with _autocast():
        out = _call(model, x)
    assert torch.isfinite(out).all()
    out.float().square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {bad}"
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
