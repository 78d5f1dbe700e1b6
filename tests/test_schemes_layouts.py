"""Interchangeable positional schemes and attention layouts: the invariance table.

Every (family, posenc, attention) combination ``eqvit.create_model`` accepts is built from a tiny
model, its parameters noised first (so that zero-initialised parts hide nothing), and checked in
float64: exact invariance (or equivariance) under the model's group, and ``eqvit.fuse`` agreement.
Combinations that cannot be equivariant raise a ValueError naming the valid ones; a deliberately
broken basis change fails the check.

``python -m pytest tests/test_schemes_layouts.py -q -s`` prints the table.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from randomise import randomise_
from test_models import call, random_input

import eqvit
from eqvit.nn.basis import AttentionInBasis, FrameRotary, HeadBasis
from eqvit.testing import EquivarianceError, assert_equivariant

PLANAR = ("invariant_ape", "frame_rope", "none")
LAYOUTS = ("coupled", "irrepwise", "frames")
POINTS: dict = {}  # the registered tiny model (I frames); dict(group="T", embed_dim=48) is 3x faster

COMBINATIONS = (
    [("o2vit_square_tiny", {}, p, a) for p in PLANAR for a in LAYOUTS]
    + [("o2vit_hex_tiny", {}, p, a) for p in PLANAR for a in LAYOUTS]
    + [("platonic_image_tiny", {}, p, a) for p in PLANAR for a in LAYOUTS]
    + [("platonic_points_tiny", POINTS, p, a) for p in ("frame_rope", "none") for a in LAYOUTS]
    # sphere models: the new combinations (frame RoPE with frames / coupled heads is the seed's, in test_models)
    + [("platonic_sphere_tiny", {}, "frame_rope", "irrepwise")]
    + [("platonic_sphere_tiny", {}, "none", a) for a in LAYOUTS]
    + [("so3vit_tiny", {}, p, None) for p in ("so3rope", "none", "learned")]
)

TABLE: dict[tuple[str, str, str], tuple[float, float]] = {}


def build(name: str, extra: dict, posenc: str, attention: str | None, seed: int = 0) -> torch.nn.Module:
    kwargs = dict(extra, posenc=posenc)
    if attention is not None:
        kwargs["attention"] = attention
    torch.manual_seed(seed)
    return randomise_(eqvit.create_model(name, **kwargs), seed=seed).double().eval()


def fuse_error(model: torch.nn.Module) -> float:
    x = random_input(model, dtype=torch.float64)
    with torch.no_grad():
        expected = call(model, x)
        got = call(eqvit.fuse(model), x)
    return ((got - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize(
    "name, extra, posenc, attention", COMBINATIONS, ids=[f"{n}-{p}-{a}" for n, _, p, a in COMBINATIONS]
)
def test_every_combination_is_equivariant_and_fuses(name, extra, posenc, attention):
    model = build(name, extra, posenc, attention)
    report = assert_equivariant(model, batch_size=1)
    fused = fuse_error(model)
    TABLE[(name, posenc, attention or "-")] = (report.max_relative_error, fused)
    assert fused <= 1e-10


def test_print_the_invariance_table():
    """The table for the lead (``-s`` shows it); filled by the parametrized test above."""
    if not TABLE:
        pytest.skip("run together with test_every_combination_is_equivariant_and_fuses")
    lines = [f"{'family':<22} {'posenc':<14} {'attention':<10} {'equiv err f64':>14} {'fuse err f64':>13}"]
    for (name, posenc, attention), (err, fused) in TABLE.items():
        lines.append(f"{name:<22} {posenc:<14} {attention:<10} {err:14.2e} {fused:13.2e}")
    print("\n" + "\n".join(lines))


# --------------------------------------------------------------------------- every combination restricts

SUBGROUPS = {
    "o2vit_square_tiny": "C4",
    "o2vit_hex_tiny": "D3",
    "platonic_image_tiny": "C4",
    "platonic_points_tiny": "T",
    "platonic_sphere_tiny": "T",
}
# the Schur (components) storage of the ViT-scale models restricts too, into the same layout
COMPONENTS = [("o2vit_square_tiny", {"layout": "components"}, p, a) for p in PLANAR for a in LAYOUTS]
RESTRICTIONS = [c for c in COMBINATIONS if c[0] in SUBGROUPS] + COMPONENTS
RESTRICTION_TABLE: dict[tuple[str, str, str], tuple[str, float, float, int, int]] = {}


@pytest.mark.parametrize(
    "name, extra, posenc, attention",
    RESTRICTIONS,
    ids=[f"{n}-{p}-{a}{'-' + '-'.join(e.values()) if e else ''}" for n, e, p, a in RESTRICTIONS],
)
def test_every_combination_restricts(name, extra, posenc, attention):
    """``eqvit.restrict`` works for every scheme and layout: the same function (float64, noised
    parameters), H-equivariant in its own right, and at least as many free parameters (more wherever H's
    parametrisation is larger; the Platonic group convolutions always are)."""
    model = build(name, extra, posenc, attention)
    sub = SUBGROUPS[name]
    restricted = eqvit.restrict(model, sub)
    x = random_input(model, dtype=torch.float64)
    with torch.no_grad():
        expected = call(model, x)
        err = ((call(restricted, x) - expected).abs().max() / expected.abs().max()).item()
    assert err <= 1e-9
    report = assert_equivariant(randomise_(restricted, seed=5), batch_size=1)  # its own H parameters noised
    n_g, n_h = (sum(p.numel() for p in m.parameters()) for m in (model, restricted))
    assert n_h > n_g
    if "layout" in extra:  # the restricted model keeps the storage layout
        assert restricted.token_type.layout == model.token_type.layout == extra["layout"]
    label = name + "".join(f" ({v})" for v in extra.values() if isinstance(v, str))
    RESTRICTION_TABLE[(label, posenc, attention)] = (sub, err, report.max_relative_error, n_g, n_h)


def test_print_the_restriction_table():
    if not RESTRICTION_TABLE:
        pytest.skip("run together with test_every_combination_restricts")
    header = f"{'family':<22} {'posenc':<14} {'attention':<10} {'H':<4} {'same fn':>9} {'H-equiv':>9}"
    lines = [header + f" {'params G -> H':>16}"]
    for (name, posenc, attention), (sub, err, equiv, n_g, n_h) in RESTRICTION_TABLE.items():
        lines.append(f"{name:<22} {posenc:<14} {attention:<10} {sub:<4} {err:9.1e} {equiv:9.1e} {n_g:>7} -> {n_h:<7}")
    print("\n" + "\n".join(lines))


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
