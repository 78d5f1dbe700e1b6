"""The Fourier-basis inference form of Platonic models (``eqvit.fuse``, :mod:`eqvit.nn.fused_fourier`):
the same function as the frame-basis model, exactly invariant, and chosen for the ViT-scale models."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from randomise import randomise_

import eqvit
from eqvit.groups import get_group
from eqvit.nn.fused_fourier import FourierFrameAttention, RegularBasis, stream_cost_ratio
from eqvit.nn.fused_schur import FourierSlabMlp
from eqvit.nn.irrep_features import FeatureType
from eqvit.testing import assert_equivariant

FUSE = sys.modules["eqvit.fuse"]  # the module (``eqvit.fuse`` is the function)

CASES = [
    ("platonic_d4_small_patch16_tiny", {}),
    ("platonic_d4_base_patch16_tiny", {}),
    ("platonic_image_tiny", {"posenc": "none"}),
    ("platonic_image_tiny", {"init_values": 0.5}),  # LayerScale, kept as it is
]


@pytest.fixture
def every_width(monkeypatch):
    """The Fourier stream for the tiny test widths too."""
    monkeypatch.setattr(FUSE, "FOURIER_STREAM_MIN_CHANNELS", 1)


def _image(model: torch.nn.Module, batch: int = 2, dtype=torch.float64) -> torch.Tensor:
    side = model.domain.shape[0]
    return torch.randn(batch, model.tokenizer.in_chans, side, side, dtype=dtype)


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


def test_stream_cost_ratio():
    assert stream_cost_ratio(get_group("D4")) == 12 / 64
    assert stream_cost_ratio(get_group("O")) == 64 / 576
    assert stream_cost_ratio(get_group("I")) == 244 / 3600


@pytest.mark.parametrize("name, kwargs", CASES)
def test_fourier_stream_computes_the_same_function(every_width, name, kwargs):
    model = randomise_(eqvit.create_model(name, **kwargs)).double().eval()
    x = _image(model)
    with torch.no_grad():
        expected = model(x)
        fused = eqvit.fuse(model)
        got = fused(x)
    assert all(isinstance(b.attn, FourierFrameAttention) and isinstance(b.mlp, FourierSlabMlp) for b in fused.blocks)
    mlp = fused.blocks[0].mlp  # fc1 as Schur slabs: 12/64 of the dense group convolution's entries for D4
    hidden = mlp.num_rows * mlp.row_width
    w1 = sum(getattr(mlp, f"fc1_weight_{m}").numel() for m in range(len(mlp.fc1_plan)))
    assert w1 == stream_cost_ratio(model.frames) * hidden * mlp.in_type.dim
    assert (got - expected).abs().max() <= 1e-10 * expected.abs().max()


@pytest.mark.parametrize("name, kwargs", CASES[:3])
def test_fourier_stream_is_invariant(every_width, name, kwargs):
    fused = eqvit.fuse(randomise_(eqvit.create_model(name, **kwargs)).double())
    assert isinstance(fused.blocks[0].attn, FourierFrameAttention)
    assert_equivariant(fused, batch_size=1)  # float64: exact
    assert_equivariant(eqvit.fuse(randomise_(eqvit.create_model(name, **kwargs))), dtype=torch.float32, batch_size=1)


def test_restricted_model_still_fuses(every_width):
    """D4 -> C4 restriction of a model that fuses into the Fourier stream: the restricted model (C4
    frames: Schur ratio 6/16, above the cost bound, so the frame form) computes the same function."""
    model = randomise_(eqvit.create_model("platonic_d4_small_patch16_tiny")).double().eval()
    restricted = eqvit.restrict(model, "C4")
    x = _image(model)
    with torch.no_grad():
        expected = model(x)
        fused = eqvit.fuse(restricted)
        got = fused(x)
    assert fused.frames.name == "C4"
    assert (got - expected).abs().max() <= 1e-10 * expected.abs().max()


def test_vit_scale_models_take_the_fourier_stream():
    """At the default threshold the ViT-S/B Platonic models (48 and 96 channels per frame) take it and
    the seed-sized D4 image model (24 channels per frame) keeps the dense frame form."""
    small = eqvit.create_model("platonic_d4_small_patch16_224", depth=1)
    assert FUSE._fourier_stream_applies(small)
    assert not FUSE._fourier_stream_applies(eqvit.create_model("platonic_image_s"))
    fused = eqvit.fuse(small)
    assert isinstance(fused.blocks[0].attn, FourierFrameAttention)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        err = (fused(x) - small.eval()(x)).abs().max() / small(x).abs().max()
    assert err < 1e-4
    assert np.isfinite(err.item())
