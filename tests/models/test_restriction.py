"""Restriction of Platonic Transformers to a subgroup H of their frames G.

The regular representation of G restricted to H is ``|G:H|`` copies of H's: with right cosets
``G = u_k H r_k``, ``f_k(h) = f(h r_k)`` and ``(L_h' f)_k = L_h' f_k``. So a G-model with C channels per
frame is an H-model with ``|G:H| C`` channels per frame after a fixed permutation of the feature axis
(``RestrictionContext.permutation``). Each check below fails on a broken restriction: the layer
checks compare the restricted layer with the G layer through that permutation (a wrong coset
order, left instead of right cosets or a transposed kernel index gives a different function), the
model checks compare outputs (noised parameters, float64) and the H-equivariance of the restricted
model perturbed in its new freedom, which must then break G-equivariance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import (
    ATTENTION_LAYOUTS,
    PLANAR_SCHEMES,
    SCHEME_LAYOUTS,
    call,
    mnist_config,
    random_input,
    randomise_,
    scheme_layout_kwargs,
    write_yaml,
)

import eqvit
from eqvit.groups import get_group
from eqvit.models.restrict import SymmetryRelaxation, find_subgroup
from eqvit.models.restrict_platonic import RestrictionContext, restrict_group_conv, spatial_subgroup_names
from eqvit.models.restriction import count_parameters, restrict_module
from eqvit.nn.platonic import PlatonicAttention
from eqvit.nn.regular import GroupConvLinear
from eqvit.testing import EquivarianceError, assert_equivariant

TOL = 1e-9


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max())


def context(G_name: str, H_name: str, **kwargs) -> RestrictionContext:
    G = get_group(G_name)
    return RestrictionContext.build(G, find_subgroup(G, H_name), **kwargs)


# ------------------------------------------------------------------------------------------------
# the coset context and the subgroup names


@pytest.mark.parametrize(("G", "H", "index"), [("D4", "C4", 2), ("D4", "D1", 4), ("O", "T", 2), ("I", "T", 5)])
def test_cosets_partition_the_group_and_the_permutation_intertwines(G, H, index):
    ctx = context(G, H)
    assert ctx.index == index and ctx.cosets[0] == 0
    assert sorted(ctx.element.ravel()) == list(range(ctx.G.order))
    # the permuted G action is H's regular action on |G:H| C channels: L_h commutes with the permutation
    x = torch.randn(3, ctx.G.order * 2, dtype=torch.float64)
    V, W = eqvit.nn.irrep_features.FeatureType.frames(ctx.G, 2), ctx.feature_type(2)
    for a in range(ctx.H.order):
        torch.testing.assert_close(ctx.to_h(V.act(int(ctx.H.parent_indices[a]), x)), W.act(a, ctx.to_h(x)))


def test_spatial_subgroup_names():
    assert {"O", "T", "D4", "D3", "D2", "D2[2]", "C4", "C3", "C2", "C2[2]", "C1"} <= set(
        spatial_subgroup_names(get_group("O"))
    )
    assert {"I", "T", "D5", "D3", "D2", "C5", "C3", "C2", "C1"} <= set(spatial_subgroup_names(get_group("I")))
    T = find_subgroup(get_group("I"), "T")
    assert T.name == "T" and T.order == 12 and T.parent is get_group("I")
    with pytest.raises(ValueError, match="subgroup of O"):
        find_subgroup(get_group("O"), "D5")


# ------------------------------------------------------------------------------------------------
# layers: the restricted layer is the G layer seen through the permutation


PAIRS = [("D4", "C4"), ("D4", "D2"), ("D4", "D1"), ("D4", "C1"), ("O", "T"), ("O", "D4"), ("I", "T"), ("I", "D5")]


@pytest.mark.parametrize(("G", "H"), PAIRS, ids=["-".join(p) for p in PAIRS])
def test_group_conv_restriction(G, H):
    ctx = context(G, H)
    lin = randomise_(GroupConvLinear(ctx.G, 3, 2, impl="cayley").double())
    new = restrict_module(lin, ctx)
    assert new.weight.shape == (ctx.H.order, ctx.index * 2, ctx.index * 3)
    assert count_parameters(new) > count_parameters(lin) or ctx.index == 1
    x = torch.randn(4, ctx.G.order * 3, dtype=torch.float64)
    assert rel_err(new(ctx.to_h(x)), ctx.to_h(lin(x))) <= TOL
    assert_equivariant(new)  # an H layer in its own right (in_type/out_type are H's)


def test_group_conv_restriction_needs_right_cosets():
    """I > T is not normal: with left cosets ``r_k H`` (``element = r_k h``) the blocks are not copies
    of H's regular representation and the restricted kernel computes another function; any other
    choice of right-coset representatives (here ``h r_k`` for random h) computes the same one."""
    ctx = context("I", "T")
    lin = randomise_(GroupConvLinear(ctx.G, 2, 2).double())
    x = torch.randn(3, ctx.G.order * 2, dtype=torch.float64)
    rng = np.random.default_rng(0)
    shifted = ctx.G.cayley[ctx.H.parent_indices[rng.integers(ctx.H.order, size=ctx.index)], ctx.cosets]
    other = RestrictionContext.build(ctx.G, ctx.H, cosets=shifted)
    assert not np.array_equal(other.cosets, ctx.cosets)
    assert rel_err(restrict_module(lin, other)(other.to_h(x)), other.to_h(lin(x))) <= TOL
    left = RestrictionContext(
        ctx.G, ctx.H, ctx.cosets, ctx.G.cayley[ctx.cosets[None, :], ctx.H.parent_indices[:, None]]
    )
    assert rel_err(restrict_module(lin, left)(left.to_h(x)), left.to_h(lin(x))) > 1e-2


def test_group_conv_restriction_with_layouts():
    """Channel layouts other than ``(k, c)`` (attention's q/k/v and heads) follow the given maps."""
    ctx = context("D4", "D1")
    lin = randomise_(GroupConvLinear(ctx.G, 2, 3).double())
    in_layout = tuple(a[::-1].copy() for a in ctx.standard_layout(2))
    out_layout = tuple(a[np.random.default_rng(1).permutation(len(a))] for a in ctx.standard_layout(3))
    new = restrict_group_conv(lin, ctx, in_layout, out_layout)
    x = torch.randn(3, ctx.G.order * 2, dtype=torch.float64)
    assert rel_err(new(ctx.to_h(x, in_layout)), ctx.to_h(lin(x), out_layout)) <= TOL


@pytest.mark.parametrize("scores", ["frames", "invariant"])
@pytest.mark.parametrize(("G", "H"), [("D4", "D1"), ("O", "T")])
def test_attention_restriction(G, H, scores):
    ctx = context(G, H, scores=scores)
    attn = randomise_(PlatonicAttention(ctx.G, 8, 2, qk_norm=True, scores=scores).double())
    new = restrict_module(attn, ctx)
    assert new.num_heads == (ctx.index * 2 if scores == "frames" else 2)
    x = torch.randn(2, 5, ctx.G.order * 8, dtype=torch.float64)
    assert rel_err(new(ctx.to_h(x)), ctx.to_h(attn(x))) <= TOL
    assert_equivariant(new)


# ------------------------------------------------------------------------------------------------
# models: every family, scheme and layout restricts to the same function, H-equivariant in its own right

SQUARE = ["C4", "D2", "C2", "D1", "C1", "D2[45deg]"]
HEX = ["C6", "D3", "C3", "D2", "C2", "D1", "C1", "D3[30deg]"]
HEX_GRID = {"img_size": None}  # the hexagonal model on its own grid: equivariant to all of D6

SUBGROUP = {  # the subgroup each scheme x layout combination restricts to
    "o2vit_square_tiny": "C4",
    "o2vit_hex_tiny": "C2",  # the image-input model is D2-equivariant (the square image on the hexagonal grid)
    "platonic_image_tiny": "C4",
    "platonic_points_tiny": "T",
    "platonic_sphere_tiny": "T",
}

CASES = (
    # o2vit: every subgroup of the lattice's group (coupled heads), and the irrep-wise layout
    [("o2vit_square_tiny", {"group": "D4"}, H) for H in SQUARE]
    + [("o2vit_hex_tiny", {"group": "D6", **HEX_GRID}, H) for H in HEX]
    + [("o2vit_square_tiny", {"attention": "irrepwise"}, H) for H in ("C4", "D1")]
    + [("o2vit_hex_tiny", {"attention": "irrepwise", **HEX_GRID}, H) for H in ("D3", "C2")]
    # every positional scheme x attention layout (and the Schur storage of the ViT-scale models)
    + [(n, scheme_layout_kwargs(p, a), SUBGROUP[n]) for n, p, a in SCHEME_LAYOUTS if n in SUBGROUP]
    + [("o2vit_square_tiny", {"posenc": p, "attention": a, "layout": "components"}, "C4")
       for p in PLANAR_SCHEMES for a in ATTENTION_LAYOUTS]
    # Platonic frames: every subgroup of D4, the polyhedral groups, the options that change the layers
    + [("platonic_image_tiny", {"group": "D4"}, H) for H in ("C4", "D2", "C2", "D1", "C1")]
    + [("platonic_image_tiny",
        {"group": "D4", "scores": "invariant", "qk_norm": True, "init_values": 0.1, "head_pool": "mean"}, "D1")]
    + [("platonic_points_tiny", {"group": G}, "T") for G in ("O", "I")]
    + [("platonic_points_tiny",
        {"group": "O", "scores": "invariant", "init_values": 0.1, "head_pool": "max", "learnable_freqs": True}, "D2")]
    + [("platonic_sphere_tiny", {"group": "I"}, "T")]
    # the Fourier stream of the ViT-scale Platonic models
    + [("platonic_d4_small_patch16_tiny", {}, "C4")]
)  # fmt: skip


def case_id(name: str, kwargs: dict, sub: str) -> str:
    return "-".join([name.removesuffix("_tiny"), *(str(v) for k, v in kwargs.items() if k != "img_size"), sub])


@pytest.mark.parametrize(("name", "kwargs", "sub"), CASES, ids=[case_id(*c) for c in CASES])
def test_restriction_computes_the_same_function(name, kwargs, sub):
    """``eqvit.restrict(model, H)``: a model of the same class and width on H computing the same function
    (float64, noised parameters), in both forms; more free parameters (H's parametrisation is larger);
    H-equivariant in its own right once those parameters move."""
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model(name, **kwargs)).double().eval()
    restricted = eqvit.restrict(model, sub)
    H = restricted.group
    # H is named in the group the model's lives in (the lattice's for a model that is already a subgroup's)
    assert H.name == sub and H.parent in (model.group, model.group.parent)
    assert type(restricted) is type(model) and restricted.embed_dim == model.embed_dim
    assert restricted.token_type.group is H and restricted.token_type.dim == model.token_type.dim
    assert not restricted.training and next(restricted.parameters()).dtype == torch.float64
    if "layout" in kwargs:
        assert restricted.token_type.layout == model.token_type.layout == kwargs["layout"]
    x = random_input(model, dtype=torch.float64)
    with torch.no_grad():
        expected = call(model, x)
        assert rel_err(call(restricted, x), expected) <= TOL
        assert rel_err(call(eqvit.fold(restricted), x), expected) <= TOL
    assert count_parameters(restricted) > count_parameters(model)
    assert_equivariant(randomise_(restricted, seed=5), batch_size=1, tolerance=TOL)


def inputs(model: torch.nn.Module, seed: int = 3) -> tuple[torch.Tensor, ...]:
    x = random_input(model, dtype=torch.float64, seed=seed)
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize(
    ("name", "group", "sub"),
    [("platonic_image_tiny", "D4", "C4"), ("platonic_points_tiny", "O", "T"), ("platonic_sphere_tiny", "I", "T")],
)
def test_restricted_freedom_breaks_the_parent_group(name, group, sub):
    model = randomise_(eqvit.create_model(name, group=group)).double().eval()
    restricted = eqvit.restrict(model, sub)
    if name != "platonic_sphere_tiny":  # (60 elements on the sphere: slow) before any change, still G's function
        assert_equivariant(restricted, model.frames, tolerance=TOL)
    randomise_(restricted, seed=1)  # move in the new parameters: H-equivariant, not G-equivariant
    assert_equivariant(restricted, tolerance=TOL)
    with pytest.raises(EquivarianceError):
        assert_equivariant(restricted, model.frames, tolerance=1e-6)


def test_sphere_models_keep_the_symmetry_they_had():
    """O frames on the sphere keep only T = O n I; restricted to T frames, the model keeps T. With the
    latitude encoding (rotations about z only), restricted I -> D5 frames keep C5(z)."""
    model = randomise_(eqvit.create_model("platonic_sphere_tiny", group="O")).double().eval()
    restricted = eqvit.restrict(model, "T")
    assert restricted.group is restricted.frames and restricted.group.order == 12
    x = inputs(model)
    with torch.no_grad():
        assert rel_err(restricted(*x), model(*x)) <= TOL
    assert_equivariant(restricted, tolerance=TOL)
    model = randomise_(eqvit.create_model("platonic_sphere_tiny", symmetry_breaking="latitude")).double().eval()
    restricted = eqvit.restrict(model, "D5")
    assert restricted.group.order == 5 and restricted.group.parent is restricted.frames
    with torch.no_grad():
        assert rel_err(restricted(*inputs(model)), model(*inputs(model))) <= TOL
    assert_equivariant(restricted, tolerance=TOL)


@pytest.mark.parametrize("pool", ["max", "mean"])
def test_restriction_chains_and_keeps_dtype(pool):
    model = randomise_(eqvit.create_model("platonic_image_tiny", head_pool=pool)).eval()
    d2 = eqvit.restrict(model, "D2")
    c2 = eqvit.restrict(d2, "C2")
    assert next(c2.parameters()).dtype == torch.float32 and c2.group.name == "C2" and c2.group.parent is d2.group
    x = inputs(model)[0].float()
    with torch.no_grad():
        torch.testing.assert_close(c2(x), model(x), rtol=1e-4, atol=1e-5)
    assert count_parameters(model) < count_parameters(d2) < count_parameters(c2)
    with pytest.raises(ValueError, match="subgroup of D4"):
        eqvit.restrict(model, "C3")


def test_symmetry_relaxation_and_engine_accept_platonic_models():
    from eqvit.train.engine import check_relaxation, restrict_model

    model = randomise_(eqvit.create_model("platonic_points_tiny", group="O")).eval()
    check_relaxation(model, {1: "T", 2: "D2", 3: "C1"})
    with pytest.raises(ValueError, match=r"model\.relaxation.*subgroup of T 'D4'"):
        check_relaxation(model, {1: "T", 2: "D4"})
    relaxed, changed = SymmetryRelaxation({2: "T"}).step(model, 2)
    assert changed and relaxed.frames.name == "T"
    assert SymmetryRelaxation({2: "T"}).step(relaxed, 2) == (relaxed, False)
    engine = restrict_model(model, "T")
    x = inputs(model)
    with torch.no_grad():
        torch.testing.assert_close(engine(*(t.float() for t in x)), model(*(t.float() for t in x)))


def test_engine_relaxes_a_platonic_model_and_evaluate_rebuilds_it(tmp_path):
    from eqvit.train.config import load_config
    from eqvit.train.engine import evaluate_checkpoint, train

    cfg = mnist_config(train={"max_epochs": 1.2, "eval_every_epochs": None, "eval_every": 0})
    cfg["model"] = {
        "name": "platonic_image_tiny",
        "kwargs": {"img_size": 32, "patch_size": 8, "in_chans": 1, "num_classes": 10},
        "relaxation": {"unit": "step", "schedule": {2: "C4", 4: "C2"}},
    }
    path = write_yaml(tmp_path, cfg)
    summary = train(load_config(path), out_dir=tmp_path / "run", progress=False)
    assert summary["relaxed"] == ["C4", "C2"] and summary["group"] == "C2"
    result = evaluate_checkpoint(load_config(path), tmp_path / "run" / "last.safetensors", progress=False)
    assert result["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"])


def test_restricted_blocks_declare_the_restricted_type():
    """Each restricted block is checked through its own feature types: H frames, |G:H| times the channels."""
    from eqvit.testing import assert_equivariant

    model = randomise_(eqvit.create_model("platonic_image_tiny", group="D4")).double().eval()
    restricted = eqvit.restrict(model, "C4")
    for block in restricted.blocks:
        assert block.in_type.group is restricted.frames
        assert block.in_type.dim == model.blocks[0].in_type.dim
        assert_equivariant(block)
