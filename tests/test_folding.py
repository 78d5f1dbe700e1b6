"""``eqvit.fold``: the inference form of every registered model computes the same function, keeps the
model's symmetry, and the training form it came from keeps no weights that could go stale."""

from __future__ import annotations

import pytest
import torch
from helpers import SCHEME_LAYOUTS, TEST_MODELS, build, call, random_input, randomise_, scheme_layout_kwargs

import eqvit
from eqvit.testing import EquivarianceError, assert_equivariant


def _dtype(name: str) -> torch.dtype:
    # torch-harmonics' DISCO convolution computes in float32 whatever the model's dtype.
    return torch.float32 if name.startswith("s2transformer") else torch.float64


# Every registered model, and every positional scheme x attention layout the builders accept.
FOLD_CASES = [(name, {}) for name in TEST_MODELS] + [
    (name, scheme_layout_kwargs(p, a)) for name, p, a in SCHEME_LAYOUTS
]
FOLD_IDS = [name + "".join(f"-{v}" for v in kwargs.values()) for name, kwargs in FOLD_CASES]


@pytest.mark.parametrize(("name", "kwargs"), FOLD_CASES, ids=FOLD_IDS)
def test_fold_computes_the_same_function(name, kwargs):
    dtype = _dtype(name)
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model(name, **kwargs) if kwargs else build(name)).to(dtype).eval()
    x = random_input(model, dtype=dtype)
    with torch.no_grad():
        expected = call(model, x)
        folded = eqvit.fold(model)
        got = call(folded, x)
    tolerance = 1e-10 if dtype == torch.float64 else 1e-6
    assert (got - expected).abs().max() <= tolerance * expected.abs().max()
    assert not any(p.requires_grad for p in folded.parameters()) and not folded.training
    assert model.training is False and any(p.requires_grad for p in model.parameters())  # the original is kept
    # The same public interface: what forward_features hands the head is what it hands unfolded.
    if hasattr(model, "forward_features") and hasattr(model, "forward_head"):
        with torch.no_grad():
            features = call(model.forward_features, x)
            torch.testing.assert_close(
                call(folded.forward_features, x), features, rtol=0, atol=tolerance * features.abs().max()
            )
            torch.testing.assert_close(
                folded.forward_head(features),
                model.forward_head(features),
                rtol=0,
                atol=tolerance * expected.abs().max(),
            )


@pytest.mark.parametrize("name", TEST_MODELS)
def test_fold_leaves_no_foldable_layer(name):
    """Every layer that offers ``fold()`` was folded (a fold returning the layer itself keeps it: its children
    were folded), and the folded model's state_dict loads strictly into another folded copy."""
    model = randomise_(build(name)).eval()
    folded = eqvit.fold(model)
    for module in folded.modules():
        fold = getattr(type(module), "fold", None)
        if callable(fold):
            assert module.fold() is module, f"{name}: {type(module).__name__} left unfolded"
    other = eqvit.fold(build(name).eval())
    other.load_state_dict(folded.state_dict(), strict=True)
    x = random_input(model)
    with torch.no_grad():
        assert torch.equal(call(other, x), call(folded, x))


@pytest.mark.parametrize("name", [n for n in TEST_MODELS if not n.startswith(("s2transformer", "vit_ape"))])
def test_folded_model_is_equivariant(name):
    # Folded in float64: the folded weights keep the exactness the float64 check asks for.
    folded = eqvit.fold(randomise_(build(name)).double())
    assert_equivariant(folded, batch_size=1)
    assert_equivariant(eqvit.fold(randomise_(build(name))), dtype=torch.float32, batch_size=1)


def test_a_broken_folded_model_fails_the_check():
    folded = eqvit.fold(randomise_(build("o2vit_square_tiny")).double())
    with torch.no_grad():
        folded.blocks[0].mlp.fc1.weight.add_(0.5 * torch.randn_like(folded.blocks[0].mlp.fc1.weight))
    with pytest.raises(EquivarianceError):
        assert_equivariant(folded, batch_size=1)


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
    """Every block of the training and the folded form reads a contiguous ``[B, N, C]`` stream: a tokenizer
    that hands over a transposed view (a conv's ``flatten(2).transpose(1, 2)``) keeps every elementwise
    op and matmul of the stream on a transposed layout."""
    model = build(name).eval()
    x = random_input(model, dtype=torch.float32)
    for form in (model, eqvit.fold(model)):
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
