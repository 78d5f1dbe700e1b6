"""The Fourier stream of Platonic image models (``stream="fourier"``, :mod:`eqvit.models.platonic`): the residual
stream on the frames' Fourier coefficients, in training and folded. The same parameters and function as the
frame stream, exactly invariant, and the default for the ViT-scale models."""

from __future__ import annotations

import pytest
import torch
from helpers import randomise_

import eqvit
from eqvit.groups import get_group
from eqvit.models.platonic import build_platonic, choose_stream, stream_cost_ratio
from eqvit.nn.folded import FoldedSchurLinear
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.platonic import FourierPlatonicAttention
from eqvit.nn.regular import RegularBasis
from eqvit.testing import EquivarianceError, assert_equivariant

CASES = [
    ("platonic_d4_small_patch16_tiny", {}),
    ("platonic_d4_base_patch16_tiny", {}),
    ("platonic_image_tiny", {"posenc": "none", "stream": "fourier"}),
    ("platonic_image_tiny", {"init_values": 0.5, "stream": "fourier"}),  # LayerScale
    ("platonic_image_tiny", {"scores": "invariant", "stream": "fourier"}),
]


def _image(model: torch.nn.Module, batch: int = 2, dtype=torch.float64) -> torch.Tensor:
    side = model.domain.shape[0]
    return torch.randn(batch, model.tokenizer.in_chans, side, side, dtype=dtype)


def _frames_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The same model on the frame stream, loaded strictly with ``model``'s parameters."""
    twin = build_platonic(**{**model.config, "stream": "frames"}).to(next(model.parameters()).dtype)
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin


@pytest.mark.parametrize("group", ["D4", "C4", "D2"])
def test_regular_basis_intertwines_frames_and_irreps(group):
    G = get_group(group)
    basis = RegularBasis(G, 3)
    frames = FeatureType.frames(G, 3)
    t = torch.from_numpy(basis.transform)
    assert torch.allclose(t.T @ t, torch.eye(len(t), dtype=t.dtype), atol=1e-12)
    x = torch.randn(4, frames.dim, dtype=torch.float64)
    for g in range(G.order):
        assert torch.allclose(frames.act(g, x) @ t, basis.ftype.act(g, x @ t), atol=1e-12)


def test_stream_cost_ratio_and_choice():
    assert stream_cost_ratio(get_group("D4")) == 12 / 64
    assert stream_cost_ratio(get_group("O")) == 64 / 576
    assert stream_cost_ratio(get_group("C4")) == 6 / 16
    D4 = get_group("D4")
    assert choose_stream("auto", "image", D4, 48, "frames") == "fourier"
    assert choose_stream("auto", "image", D4, 24, "frames") == "frames"  # the seed-sized model
    assert choose_stream("auto", "image", get_group("C4"), 64, "frames") == "frames"  # 6/16: above the bound
    assert choose_stream("auto", "points", get_group("O"), 64, "frames") == "frames"
    with pytest.raises(ValueError, match="stream='fourier' applies to image models"):
        choose_stream("fourier", "points", get_group("O"), 64, "frames")
    with pytest.raises(ValueError, match="stream"):
        choose_stream("spectral", "image", D4, 64, "frames")


@pytest.mark.parametrize("name, kwargs", CASES)
def test_fourier_stream_computes_the_frame_streams_function(name, kwargs):
    """Same state_dict, same outputs and gradients as the frame stream (float64)."""
    model = randomise_(eqvit.create_model(name, **kwargs)).double()
    assert isinstance(model.blocks[0].attn, FourierPlatonicAttention)
    twin = _frames_twin(model)
    x = _image(model)
    out, expected = model(x), twin(x)
    assert (out - expected).abs().max() <= 1e-10 * expected.abs().max()
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    twin_grads = dict(twin.named_parameters())
    for key, p in model.named_parameters():
        ref = twin_grads[key].grad
        assert (p.grad - ref).abs().max() <= 1e-9 * (ref.abs().max() + 1e-12), key


@pytest.mark.parametrize("name, kwargs", CASES[:3])
def test_fourier_stream_is_invariant_and_folds_its_mlp(name, kwargs):
    """Exact invariance in float64; the folded form keeps the MLP in the Fourier basis (its agreement and
    equivariance: tests/test_folding.py)."""
    model = randomise_(eqvit.create_model(name, **kwargs)).double()
    assert_equivariant(model, batch_size=1)
    assert isinstance(eqvit.fold(model).blocks[0].mlp.fc1, FoldedSchurLinear)


def test_a_broken_fourier_block_fails_the_check():
    model = randomise_(eqvit.create_model("platonic_d4_small_patch16_tiny")).double()
    with torch.no_grad():
        frames = model.blocks[0].attn.to_frames
        frames.add_(0.2 * torch.randn_like(frames))  # no longer the inverse transform of the q/k/v rows
    with pytest.raises(EquivarianceError):
        assert_equivariant(model, batch_size=1)


def test_vit_scale_models_take_the_fourier_stream():
    small = eqvit.create_model("platonic_d4_small_patch16_224", depth=1)
    assert small.config["stream"] == "fourier" and isinstance(small.blocks[0].attn, FourierPlatonicAttention)
    assert eqvit.create_model("platonic_image_s").config["stream"] == "auto"
    assert not isinstance(eqvit.create_model("platonic_image_s").blocks[0].attn, FourierPlatonicAttention)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ref = small.eval()(x)
        err = (eqvit.fold(small)(x) - ref).abs().max() / ref.abs().max()
    assert err < 1e-4


@pytest.mark.parametrize("basis", ["frames", "fourier"])
def test_platonic_mlp_drops_its_hidden_features_in_both_bases(basis):
    """Dropout acts on the hidden frames and on the output, in the Fourier rows as on the frames."""
    from eqvit.nn.platonic import PlatonicMlp

    mlp = PlatonicMlp(get_group("D4"), 4, 8, drop=0.5, basis=basis).train()
    sizes = []
    mlp.drop.register_forward_hook(lambda module, args, out: sizes.append(out.numel()))
    mlp(torch.randn(3, 5, mlp.in_type.dim))
    assert sizes == [3 * 5 * 8 * 8, 3 * 5 * 8 * 4]  # hidden: 8 frames x 8 channels per token; output: 8 x 4
