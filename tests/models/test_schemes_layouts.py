"""Interchangeable positional schemes and attention layouts.

Every (family, posenc, attention) combination ``eqvit.create_model`` accepts is built from a tiny
model, its parameters noised first (so that zero-initialised parts hide nothing), and checked in
float64: exact invariance (or equivariance) under the model's group. Combinations that cannot be
equivariant raise a ValueError naming the valid ones; a deliberately broken basis change fails the check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ATTENTION_LAYOUTS, SCHEME_LAYOUTS, call, random_input, randomise_

import eqvit
from eqvit.nn.basis import AttentionInBasis, FrameRotary, HeadBasis
from eqvit.testing import EquivarianceError, assert_equivariant

LAYOUTS = ATTENTION_LAYOUTS


def build(name: str, extra: dict, posenc: str, attention: str | None, seed: int = 0) -> torch.nn.Module:
    kwargs = dict(extra, posenc=posenc)
    if attention is not None:
        kwargs["attention"] = attention
    torch.manual_seed(seed)
    return randomise_(eqvit.create_model(name, **kwargs), seed=seed).double().eval()


@pytest.mark.parametrize(
    ("name", "posenc", "attention"), SCHEME_LAYOUTS, ids=["-".join(map(str, c)) for c in SCHEME_LAYOUTS]
)
def test_every_combination_is_equivariant(name, posenc, attention):
    """Exact in float64 under the model's group (its folded form: tests/test_folding.py)."""
    assert_equivariant(build(name, {}, posenc, attention), batch_size=1)


# --------------------------------------------------------------------------- the layouts are what they say


def test_defaults_are_unchanged():
    o2 = eqvit.create_model("o2vit_square_tiny")
    assert type(o2.posenc).__name__ == "InvariantAPE" and o2.config["attention"] == "coupled"
    assert type(o2.blocks[0].attn.head_basis).__name__ == "IdentityBasis"
    platonic = eqvit.create_model("platonic_image_tiny")
    assert type(platonic.posenc).__name__ == "FrameRoPE" and platonic.blocks[0].attn.scores == "frames"
    assert type(eqvit.create_model("so3vit_tiny").posenc).__name__ == "SO3RoPE"
    # coupled heads on frame features are the seed's invariant scores
    assert eqvit.create_model("platonic_image_tiny", attention="coupled").blocks[0].attn.scores == "invariant"
    assert isinstance(eqvit.create_model("platonic_image_tiny", attention="irrepwise").blocks[0].attn, AttentionInBasis)


@pytest.mark.parametrize(
    "name, extra, other",
    [
        ("o2vit_square_tiny", {"attention": "coupled"}, {"posenc": "none"}),
        ("o2vit_square_tiny", {"attention": "frames"}, {"posenc": "none"}),
        ("platonic_image_tiny", {"attention": "irrepwise"}, {"posenc": "none"}),
    ],
)
def test_frame_rope_changes_the_function(name, extra, other):
    """Frame RoPE is not silently skipped: with the same weights, the model without it differs."""
    with_rope = build(name, extra, "frame_rope", extra.get("attention"))
    without = eqvit.create_model(name, **dict(extra, **other)).double().eval()
    without.load_state_dict(with_rope.state_dict())
    x = random_input(with_rope, dtype=torch.float64)
    with torch.no_grad():
        assert not torch.allclose(call(with_rope, x), call(without, x))


def test_layouts_share_parameters_but_differ():
    """Coupled, irrep-wise and frames-as-heads hold the same q/k/v/proj parameters on O(2) models: only
    the heads differ, so the functions do."""
    coupled = build("o2vit_square_tiny", {}, "invariant_ape", "coupled")
    x = random_input(coupled, dtype=torch.float64)
    outputs = []
    for layout in LAYOUTS:
        model = eqvit.create_model("o2vit_square_tiny", attention=layout).double().eval()
        model.load_state_dict(coupled.state_dict())
        with torch.no_grad():
            outputs.append(call(model, x))
    assert not torch.allclose(outputs[0], outputs[1]) and not torch.allclose(outputs[0], outputs[2])


# --------------------------------------------------------------------------- invalid combinations


@pytest.mark.parametrize(
    "name, kwargs, valid",
    [
        ("platonic_points_tiny", {"posenc": "invariant_ape"}, ["frame_rope", "none"]),
        ("platonic_sphere_tiny", {"posenc": "invariant_ape"}, ["one token per position", "frame_rope", "none"]),
        ("platonic_image_tiny", {"posenc": "so3rope"}, ["invariant_ape", "frame_rope", "none"]),
        ("o2vit_square_tiny", {"posenc": "so3rope"}, ["invariant_ape", "frame_rope", "none"]),
        ("o2vit_hex_tiny", {"attention": "invariant"}, ["coupled", "irrepwise", "frames"]),
        ("platonic_image_tiny", {"attention": "heads"}, ["frames", "coupled", "irrepwise"]),
        ("so3vit_tiny", {"posenc": "frame_rope"}, ["so3rope", "none", "learned", "ape"]),
    ],
)
def test_invalid_combinations_name_the_valid_ones(name, kwargs, valid):
    with pytest.raises(ValueError) as err:
        eqvit.create_model(name, **kwargs)
    assert all(v in str(err.value) for v in valid), str(err.value)


def test_combinations_that_cannot_be_equivariant_are_refused():
    # frame RoPE and frames-as-heads need copies of the regular representation
    for kwargs in ({"posenc": "frame_rope"}, {"attention": "frames"}):
        with pytest.raises(ValueError, match="regular representation"):
            eqvit.create_model("o2vit_square_tiny", multiplicities={"A1": 4, "E1": 2}, num_heads=2, **kwargs)
    with pytest.raises(ValueError, match="qk_norm"):  # a LayerNorm over an irrep-wise head is not equivariant
        eqvit.create_model("platonic_image_tiny", attention="irrepwise", qk_norm=True)
    with pytest.raises(ValueError, match="invariant"):  # scores='invariant' is the coupled layout
        eqvit.create_model("platonic_image_tiny", scores="invariant", attention="frames")


# --------------------------------------------------------------------------- broken adapters fail


def _random_orthogonal(n: int, seed: int = 1) -> torch.Tensor:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return torch.from_numpy(q)


@pytest.mark.parametrize(
    "name, posenc, attention, module",
    [
        ("o2vit_square_tiny", "frame_rope", "coupled", FrameRotary),  # q, k rotated in a wrong "frame" basis
        ("o2vit_square_tiny", "none", "frames", HeadBasis),  # frames as heads read in a wrong basis
        ("platonic_image_tiny", "none", "irrepwise", AttentionInBasis),  # a wrong Fourier transform
    ],
)
def test_a_wrong_basis_change_fails_the_check(name, posenc, attention, module):
    model = build(name, {}, posenc, attention)
    assert_equivariant(model, batch_size=1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, module):
                buffer = next(iter(m.buffers(recurse=False)))
                buffer.copy_(_random_orthogonal(buffer.shape[0]))
    with pytest.raises(EquivarianceError):
        assert_equivariant(model, batch_size=1)


@pytest.mark.parametrize("group, channels, heads", [("D4", 4, 2), ("D6", 3, 3), ("C4", 6, 3)])
def test_coupled_heads_are_channel_groups_over_all_frames(group, channels, heads):
    """With the channel-major Fourier ordering, coupled head r (irrep basis) spans exactly channels
    ``[r C / h, (r + 1) C / h)`` of every frame: coupled attention is the Platonic invariant-score layout,
    and frame RoPE split over those channel groups keeps relative scores."""
    from eqvit.groups import get_group
    from eqvit.nn.irrep_attention import coupled_heads
    from eqvit.nn.irrep_features import FeatureType

    G = get_group(group)
    frames = FeatureType.frames(G, channels)
    F = np.asarray(frames.fourier)  # x_frames @ F = x_irrep
    size = channels // heads
    for r, head in enumerate(coupled_heads(frames.in_irrep_basis(), heads)):
        projector = np.zeros((frames.dim, frames.dim))
        projector[head, head] = 1.0
        in_frames = F @ projector @ F.T
        coords = [j * channels + c for j in range(G.order) for c in range(r * size, (r + 1) * size)]
        expected = np.zeros_like(in_frames)
        expected[coords, coords] = 1.0
        np.testing.assert_allclose(in_frames, expected, atol=1e-12)
