"""Mixed precision: every registered tiny model runs under CPU bf16 autocast, forward and backward, and
no weight computed under one autocast state reaches a forward in another: the
training form derives its weights on every call, the folded form (``eqvit.fold``) keeps
them in the model's dtype and autocast casts them per call."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import randomise_
from torch import nn

import eqvit

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


@pytest.mark.parametrize("name", TINY)
def test_folded_models_under_autocast(name):
    """The folded form's frozen weights: an autocast forward leaves a later fp32 forward as it was, and is
    bf16-close to it."""
    folded = eqvit.fold(_model(name))
    x = _input(folded)
    with torch.no_grad():
        expected = _call(folded, x)
        with _autocast():
            low = _call(folded, x)
        assert torch.equal(_call(folded, x), expected)
    assert (low.float() - expected).abs().max() <= 0.1 * expected.abs().max()


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
