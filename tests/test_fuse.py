"""``eqvit.fuse``: the inference form of every registered model computes the same function, keeps the
model's symmetry, and the training form it came from keeps no weights that could go stale."""

from __future__ import annotations

import pytest
import torch
from helpers import TEST_MODELS, build, call, random_input, randomise_

import eqvit
from eqvit.testing import EquivarianceError, assert_equivariant


def _dtype(name: str) -> torch.dtype:
    # torch-harmonics' DISCO convolution computes in float32 whatever the model's dtype.
    return torch.float32 if name.startswith("s2transformer") else torch.float64


@pytest.mark.parametrize("name", TEST_MODELS)
def test_fuse_computes_the_same_function(name):
    dtype = _dtype(name)
    model = randomise_(build(name)).to(dtype).eval()
    x = random_input(model, dtype=dtype)
    with torch.no_grad():
        expected = call(model, x)
        fused = eqvit.fuse(model)
        got = call(fused, x)
    tolerance = 1e-10 if dtype == torch.float64 else 1e-6
    assert (got - expected).abs().max() <= tolerance * expected.abs().max()
    assert not any(p.requires_grad for p in fused.parameters()) and not fused.training
    assert model.training is False and any(p.requires_grad for p in model.parameters())  # the original is kept
    # The same public interface: what forward_features hands the head is what it hands unfused.
    if hasattr(model, "forward_features") and hasattr(model, "forward_head"):
        with torch.no_grad():
            features = call(model.forward_features, x)
            torch.testing.assert_close(
                call(fused.forward_features, x), features, rtol=0, atol=tolerance * features.abs().max()
            )
            torch.testing.assert_close(
                fused.forward_head(features),
                model.forward_head(features),
                rtol=0,
                atol=tolerance * expected.abs().max(),
            )


@pytest.mark.parametrize("name", TEST_MODELS)
def test_fuse_leaves_no_foldable_layer(name):
    """Every layer that offers ``fold()`` was folded (a fold returning the layer itself keeps it: its children
    were folded), and the folded model's state_dict loads strictly into another fused copy."""
    model = randomise_(build(name)).eval()
    fused = eqvit.fuse(model)
    for module in fused.modules():
        fold = getattr(type(module), "fold", None)
        if callable(fold):
            assert module.fold() is module, f"{name}: {type(module).__name__} left unfolded"
    other = eqvit.fuse(build(name).eval())
    other.load_state_dict(fused.state_dict(), strict=True)
    x = random_input(model)
    with torch.no_grad():
        assert torch.equal(call(other, x), call(fused, x))


@pytest.mark.parametrize("name", [n for n in TEST_MODELS if not n.startswith(("s2transformer", "vit_ape"))])
def test_fused_model_is_equivariant(name):
    # Fused in float64: the folded weights keep the exactness the float64 check asks for.
    fused = eqvit.fuse(randomise_(build(name)).double())
    assert_equivariant(fused, batch_size=1)
    assert_equivariant(eqvit.fuse(randomise_(build(name))), dtype=torch.float32, batch_size=1)


def test_a_broken_fused_model_fails_the_check():
    fused = eqvit.fuse(randomise_(build("o2vit_square_tiny")).double())
    with torch.no_grad():
        fused.blocks[0].mlp.fc1.weight.add_(0.5 * torch.randn_like(fused.blocks[0].mlp.fc1.weight))
    with pytest.raises(EquivarianceError):
        assert_equivariant(fused, batch_size=1)


@pytest.mark.parametrize("name", TEST_MODELS)
def test_training_form_follows_in_place_parameter_changes(name):
    """No cache in the training form: after an in-place change (an optimizer step does the same) a
    no-grad forward computes what a freshly built copy with those parameters computes."""
    model = randomise_(build(name)).eval()
    x = random_input(model)
    with torch.no_grad():
        before = call(model, x)
        for p in model.parameters():
            p.mul_(1.25).add_(0.01)
        after = call(model, x)
        reference = build(name).eval()
        reference.load_state_dict(model.state_dict())
        assert torch.equal(after, call(reference, x))
    assert not torch.equal(after, before)


@pytest.mark.parametrize("name", [n for n in TEST_MODELS if not n.startswith("s2transformer")])
def test_the_residual_stream_is_token_major(name):
    """Every block of the training and the fused form reads a contiguous ``[B, N, C]`` stream: a tokenizer
    that hands over a transposed view (a conv's ``flatten(2).transpose(1, 2)``) keeps every elementwise
    op and matmul of the stream on a transposed layout."""
    model = build(name).eval()
    x = random_input(model, dtype=torch.float32)
    for form in (model, eqvit.fuse(model)):
        seen = []
        handles = [
            b.register_forward_pre_hook(lambda m, args, seen=seen: seen.append(args[0].is_contiguous()))
            for b in form.blocks
        ]
        with torch.no_grad():
            call(form, x)
        for h in handles:
            h.remove()
        assert seen and all(seen), f"{name}: block inputs contiguous {seen}"
