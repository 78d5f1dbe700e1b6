"""timm's model interface on every registered model, and timm's own generic checks adapted to eqvit.

timm's ``tests/test_models.py`` builds every model from its ``pretrained_cfg['input_size']`` and runs
``test_model_forward``, ``test_model_backward``, ``test_model_default_cfgs``,
``test_model_forward_features`` (``features_only=True``) and ``test_model_forward_intermediates``.
The same checks run here over ``eqvit.list_models()`` (each family's ``*_tiny``), with the input each
family takes: images ``[B, C, H, W]``, hexagonal images ``[B, C, P]``, icosphere fields ``[B, C, V]``,
lat-lon fields ``[B, C, nlat, nlon]`` (all ``[B, *input_size]``) and point clouds ``(pos [B, N, 3],
feat [B, N, C])``. Intermediate maps exist for the image models only (``o2vit_*``,
``platonic_image_*``): their patch tokens lie on a grid.

The equivariance of the intermediate maps is checked with ``assert_equivariant`` on the function
``x -> forward_intermediates(x)``: the input moves by the domain's action, each map by
``model.intermediate_action`` (the patch grid permuted as points, the channels by the tokens'
feature type); a model with a position-dependent token bias, and either half of the action alone,
must fail the same check.
"""

from __future__ import annotations

import copy
from functools import cache, partial

import numpy as np
import pytest
import timm
import timm.data
import timm.optim
import torch
from helpers import randomise_
from PIL import Image
from torch import nn

import eqvit
import eqvit.models.vit as vit_module
from eqvit.geometry.domain import PointCloudDomain
from eqvit.models import is_model
from eqvit.models.restrict import restrict
from eqvit.models.vit import EquivariantViT
from eqvit.testing import EquivarianceError, assert_equivariant


def _tiny(name: str) -> str:
    family = name.rsplit("_", 1)[0]
    return f"{family}_tiny" if is_model(f"{family}_tiny") else name


TEST_MODELS = sorted({_tiny(name) for name in eqvit.list_models()})
IMAGE_MODELS = [n for n in TEST_MODELS if n.startswith(("o2vit_", "platonic_image_", "platonic_d4_"))]
SQUARE_MODELS = [n for n in IMAGE_MODELS if not n.startswith(("o2vit_hex", "o2vit_d6_"))]  # d6: hexagonal
CLASSIFIERS = IMAGE_MODELS + [n for n in TEST_MODELS if n.startswith(("platonic_points_", "platonic_qm9_"))]
DENSE_MODELS = [n for n in TEST_MODELS if n not in CLASSIFIERS]
# EquivariantViTs (the DiP denoisers' blocks take the diffusion time: no timm grad-checkpointing interface)
VIT_MODELS = [n for n in TEST_MODELS if not n.startswith(("s2transformer_", "dip_"))]
CFG_KEYS = ("architecture", "input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")
CFG_KEYS += ("num_classes", "first_conv", "classifier", "fixed_input_size", "pool_size")


@cache
def _pristine(name: str, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **kwargs)


def build(name: str, **kwargs) -> nn.Module:
    return copy.deepcopy(_pristine(name, **kwargs))


def cfg_input(model: nn.Module, batch: int = 2, dtype: torch.dtype = torch.float32, seed: int = 0):
    """timm's test input, ``torch.randn(batch, *input_size)``; point clouds get their domain's random input,
    ``(pos, feat)`` standard normal of ``input_size`` (denoisers, ``dip_*``: and a time per sample)."""
    gen = torch.Generator().manual_seed(seed)
    size = model.pretrained_cfg["input_size"]
    if isinstance(getattr(model, "domain", None), PointCloudDomain):  # platonic_points_*, platonic_qm9_*, dip_*
        assert size == (model.domain.num_points, model.domain.dim)
        return model.domain.random_input(batch, model.in_chans, generator=gen, dtype=dtype)
    return torch.randn(batch, *size, generator=gen, dtype=torch.float64).to(dtype)


def call(fn, x):
    return fn(*x) if isinstance(x, tuple) else fn(x)


# ------------------------------------------------------------------------------------------------
# timm's generic checks


@pytest.mark.parametrize("name", TEST_MODELS)
def test_model_forward(name):
    model = build(name).eval()
    with torch.no_grad():
        out = call(model, cfg_input(model, batch=1))
    assert out.shape[0] == 1
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("name", TEST_MODELS)
def test_model_backward(name):
    kwargs = dict(num_classes=42) if name in CLASSIFIERS else {}
    model = build(name, **kwargs).train()
    out = call(model, cfg_input(model))
    out.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    if name in CLASSIFIERS:
        assert out.shape == (2, 42)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("name", TEST_MODELS)
def test_model_default_cfgs(name):
    model = build(name).eval()
    cfg = model.pretrained_cfg
    assert model.default_cfg is cfg
    assert set(CFG_KEYS) <= set(cfg), sorted(set(CFG_KEYS) - set(cfg))
    assert cfg["architecture"] == name
    assert len(cfg["mean"]) == len(cfg["std"]) == model.in_chans
    # input_size is the input the model takes (checked by its domain) and describes.
    x = cfg_input(model, batch=1)
    model.domain.check(x, model.in_chans)
    assert model.domain.describe_input(model.in_chans) == cfg["input_layout"]
    assert cfg["num_classes"] == getattr(model, "num_classes", 0)
    # classifier and first_conv name real modules with parameters (the O(2) patch embedding keeps its
    # irrep-wise blocks as weights.0, weights.1, ...; the others have a .weight as in timm).
    state = model.state_dict()
    for key in ("classifier", "first_conv"):
        module = model.get_submodule(cfg[key])
        own = [n for n, _ in module.named_parameters(recurse=False)]
        assert own, f"{key} {cfg[key]!r} has no parameters"
        assert all(f"{cfg[key]}.{n}" in state for n in own)
        assert f"{cfg[key]}.weight" in state or name.startswith("o2vit_")
    if name not in CLASSIFIERS:
        return
    # forward_features is unpooled (NLC, num_features wide); forward_head(pre_logits) is head_hidden_size.
    with torch.no_grad():
        features = call(model.forward_features, x)
        pre = model.forward_head(features, pre_logits=True)
        assert features.shape[-1] == model.num_features
        assert pre.shape == (1, model.head_hidden_size)
        model.reset_classifier(0)
        out = call(model, x)
    assert out.shape == pre.shape
    torch.testing.assert_close(out, pre)


@pytest.mark.parametrize("name", IMAGE_MODELS)
@pytest.mark.parametrize("factory", ["eqvit", "timm"])
def test_model_forward_features(name, factory):
    create = eqvit.create_model if factory == "eqvit" else timm.create_model
    torch.manual_seed(0)
    net = create(name, features_only=True).eval()
    channels, reductions = net.feature_info.channels(), net.feature_info.reduction()
    assert len(channels) == min(3, len(net.model.blocks))
    x = cfg_input(net, batch=1)
    with torch.no_grad():
        maps = net(x)
    assert len(maps) == len(channels)
    grid = net.model.token_grid.shape
    for c, r, m in zip(channels, reductions, maps):
        assert m.shape == (1, c, *grid)
        if len(grid) == 2:  # square images: H' = H / reduction, like timm's ViT
            assert grid == tuple(s // r for s in x.shape[-2:])
        assert not torch.isnan(m).any()
    assert "num_classes" not in net.pretrained_cfg and net.pretrained_cfg["input_size"] == tuple(x.shape[1:])


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_model_forward_intermediates(name):
    model = randomise_(build(name)).eval()
    info = timm.models.FeatureInfo(model.feature_info, len(model.feature_info))
    x = cfg_input(model)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        assert len(maps) == len(info.channels()) == len(model.blocks)
        for c, m in zip(info.channels(), maps):
            assert m.shape == (2, c, *model.token_grid.shape)
        # The final features and the logits are the normal forward's.
        assert torch.equal(final, model.forward_features(x))
        torch.testing.assert_close(model.forward_head(final), model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in IMAGE_MODELS if n in CLASSIFIERS])
def test_forward_reads_out_the_tokens_the_head_reads(name):
    """A classifier's forward normalises and reads out only the tokens its head reads (``select_tokens``); with
    the head pruned, the model returns the features of every token."""
    model = randomise_(build(name)).eval()
    x = cfg_input(model)
    with torch.no_grad():
        features = model.forward_features(x)
        torch.testing.assert_close(model(x), model.head(features), rtol=1e-6, atol=1e-6)
        model.prune_intermediate_layers(indices=len(model.blocks), prune_head=True)
        assert torch.equal(model(x), model.forward_features(x)) and model(x).shape == features.shape


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_intermediates_are_the_block_outputs(name):
    """Against the plain composition: tokens -> block(tokens) -> ..., each block on irrep-wise (or regular)
    tokens."""
    model = randomise_(build(name)).double().eval()
    x = cfg_input(model, dtype=torch.float64)
    p = model.num_prefix_tokens
    with torch.no_grad():
        encoded = model.input_encoding(x)  # hexagonal models on square images: resampled onto their grid
        tokens, reference = model.embed_tokens(encoded), []
        for block in model.blocks:
            tokens = block(tokens, model.posenc.rope_for(encoded), p)
            reference.append(tokens)
        nlc = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
        nchw = model.forward_intermediates(x, intermediates_only=True)
        normed = model.forward_intermediates(x, norm=True, intermediates_only=True, return_prefix_tokens=True)
        last = model.forward_intermediates(x, indices=[-1], stop_early=True, intermediates_only=True)
        first = model.forward_intermediates(x, indices=[0], stop_early=True, intermediates_only=True)
    for ref, a, b, (c, prefix) in zip(reference, nlc, nchw, normed):
        torch.testing.assert_close(a, model.to_token_type(ref[:, p:]), rtol=1e-10, atol=1e-12)  # in token_type
        assert torch.equal(model.token_grid.from_map(b).transpose(1, 2), a)  # NCHW is NLC laid out as a map
        torch.testing.assert_close(
            model.token_grid.from_map(c).transpose(1, 2),
            model.to_token_type(model.norm(ref)[:, p:]),
            rtol=1e-10,
            atol=1e-12,
        )
        torch.testing.assert_close(prefix, model.to_token_type(model.norm(ref)[:, :p]), rtol=1e-10, atol=1e-12)
    assert torch.equal(last[0], nchw[-1]) and torch.equal(first[0], nchw[0])


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_intermediate_indices_are_checked(name):
    model = build(name)
    x = cfg_input(model, batch=1)
    depth = len(model.blocks)
    for bad in (depth + 1, 0, [depth], [-depth - 1]):
        with pytest.raises(ValueError, match="expected"):
            model.forward_intermediates(x, indices=bad)
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(ValueError, match="expected input of shape"):
        model.forward_intermediates(x[..., :-1])


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_prune_intermediate_layers(name):
    model = randomise_(build(name)).eval()
    x = cfg_input(model)
    with torch.no_grad():
        full = model.forward_intermediates(x, intermediates_only=True)
    assert model.prune_intermediate_layers([0], prune_norm=True) == [0]
    assert len(model.blocks) == 1 and len(model.feature_info) == 1
    assert isinstance(model.head, nn.Identity)
    assert isinstance(model.norm, nn.Identity)
    with torch.no_grad():
        (pruned,) = model.forward_intermediates(x, indices=[0], intermediates_only=True)
    assert torch.equal(pruned, full[0])
    assert not any(n.startswith("head.") for n in model.state_dict())


# ------------------------------------------------------------------------------------------------
# equivariance of the intermediate maps


def _maps(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Every block's map and its normalised form, stacked ``[2 L, B, C, *grid]``."""
    plain = model.forward_intermediates(x, intermediates_only=True)
    normed = model.forward_intermediates(x, norm=True, intermediates_only=True)
    return torch.stack([*plain, *normed])


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_intermediate_maps_are_equivariant(name):
    model = randomise_(build(name)).double().eval()
    x = cfg_input(model, dtype=torch.float64)
    fn = partial(_maps, model)
    report = assert_equivariant(
        fn, model.group, inputs=x, input_action=model.domain.act, output_action=model.intermediate_action
    )
    assert report.passed and len(report.rows) == model.group.order
    # Neither half of the action alone is the action: the check can fail.
    grid_only = lambda g, y: model.token_grid.act(g, y)  # noqa: E731
    elements = model.token_type.group.elements

    def channels_only(g, y):
        index = int(np.flatnonzero(np.abs(elements - g).max((1, 2)) < 1e-9)[0])
        return model.token_type.act(index, y.movedim(-1 - len(model.token_grid.shape), -1)).movedim(
            -1, -1 - len(model.token_grid.shape)
        )

    for wrong in (grid_only, channels_only):
        with pytest.raises(EquivarianceError):
            assert_equivariant(fn, model.group, inputs=x, input_action=model.domain.act, output_action=wrong)


class _TokenBias(nn.Module):
    """A learned vector per token position: breaks the permutation of the tokens by the group."""

    def __init__(self, tokenizer: nn.Module, num_tokens: int, dim: int) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        gen = torch.Generator().manual_seed(3)
        self.bias = nn.Parameter(torch.randn(num_tokens, dim, generator=gen, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tokenizer(x) + self.bias


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_broken_model_fails_the_intermediate_map_check(name):
    model = randomise_(build(name)).double().eval()
    p = model.num_prefix_tokens
    model.tokenizer = _TokenBias(model.tokenizer, model.tokenizer.num_tokens + p, model.embed_dim)
    x = cfg_input(model, dtype=torch.float64)
    with pytest.raises(EquivarianceError) as info:
        assert_equivariant(
            partial(_maps, model),
            model.group,
            inputs=x,
            input_action=model.domain.act,
            output_action=model.intermediate_action,
        )
    assert info.value.report.rows[0][2] == 0.0  # the identity still passes


def test_restricted_model_keeps_equivariant_intermediate_maps():
    model = randomise_(build("o2vit_square_tiny")).eval()
    small = restrict(model, "D2").double()
    x = cfg_input(model, dtype=torch.float64)
    assert small.group.order == 4
    report = assert_equivariant(
        partial(_maps, small), inputs=x, group=small.group, input_action=small.domain.act,
        output_action=small.intermediate_action,
    )  # fmt: skip
    assert report.passed


# ------------------------------------------------------------------------------------------------
# classifier interface


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_reset_classifier_and_forward_head(name):
    model = randomise_(build(name)).eval()
    x = cfg_input(model)
    assert isinstance(model.get_classifier(), nn.Linear)
    assert model.get_classifier().out_features == model.num_classes == model.pretrained_cfg["num_classes"]
    model.reset_classifier(7)
    assert model.num_classes == 7 and model.get_classifier().out_features == 7 and model.out_chans == 7
    with torch.no_grad():
        assert call(model, x).shape == (2, 7)
    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), nn.Identity) and model.num_classes == 0
    assert model.out_chans == model.head_hidden_size
    with torch.no_grad():
        pre = model.forward_head(call(model.forward_features, x), pre_logits=True)
        out = call(model, x)
    assert out.shape == (2, model.head_hidden_size)
    torch.testing.assert_close(out, pre)
    torch.testing.assert_close(call(model, x), pre)  # with autograd too
    # The pooled features are invariant.
    assert_equivariant(model, output_action="invariant")
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="num_classes"):
            model.reset_classifier(bad)
    with pytest.raises(ValueError, match="global_pool"):
        model.reset_classifier(3, "avg")


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_num_classes_zero_at_creation_returns_the_pooled_features(name):
    torch.manual_seed(0)
    model = eqvit.create_model(name, num_classes=0).eval()
    assert model.num_classes == 0 and model.pretrained_cfg["num_classes"] == 0
    with torch.no_grad():
        assert call(model, cfg_input(model)).shape == (2, model.head_hidden_size)


def test_reset_classifier_survives_a_rebuild_from_the_config():
    """reset_classifier updates the saved config, so a checkpoint's config rebuilds the same shapes."""
    model = build("o2vit_square_tiny")
    model.reset_classifier(9)
    rebuilt = eqvit.models.o2vit.build_o2vit(**model.config)
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", DENSE_MODELS)
def test_dense_models_have_no_classifier_and_no_feature_maps(name):
    model = build(name)
    assert not hasattr(model, "num_classes") and model.pretrained_cfg["num_classes"] == 0
    with pytest.raises(ValueError, match="features_only"):
        eqvit.create_model(name, features_only=True)
    if not isinstance(model, EquivariantViT):
        return
    for attempt in (model.get_classifier, lambda: model.reset_classifier(3)):
        with pytest.raises(ValueError, match="classifier head"):
            attempt()
    with pytest.raises(ValueError, match="image grid"):
        model.forward_intermediates(cfg_input(model))


def test_feature_options_are_checked():
    with pytest.raises(ValueError, match="feature_cls"):
        eqvit.create_model("o2vit_square_tiny", features_only=True, feature_cls="hook")
    with pytest.raises(ValueError, match="features_only"):
        eqvit.create_model("o2vit_square_tiny", out_indices=(0,))
    net = timm.create_model("o2vit_square_tiny", features_only=True, out_indices=(0,), output_fmt="NLC")
    (only,) = net(cfg_input(net))
    assert only.shape == (2, 4, net.feature_info.channels()[0])
    overlaid = timm.create_model("o2vit_square_tiny", pretrained_cfg_overlay=dict(mean=(0.1, 0.2, 0.3)))
    assert overlaid.pretrained_cfg["mean"] == (0.1, 0.2, 0.3)


# ------------------------------------------------------------------------------------------------
# training helpers


@pytest.mark.parametrize("name", VIT_MODELS)
def test_grad_checkpointing_gives_the_same_outputs_and_gradients(name, monkeypatch):
    model = randomise_(build(name)).eval()  # eval: no dropout, so the two runs see the same function
    x = cfg_input(model)
    out = call(model, x)
    out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    calls = []
    real = vit_module.checkpoint
    monkeypatch.setattr(vit_module, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    model.set_grad_checkpointing(True)
    assert model.grad_checkpointing
    again = call(model, x)
    again.square().sum().backward()
    assert len(calls) == len(model.blocks)
    torch.testing.assert_close(again, out, rtol=0, atol=0)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-6, atol=1e-9, msg=n)
    model.set_grad_checkpointing(False)
    call(model, x)
    assert len(calls) == len(model.blocks)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_layer_decay_optimizer(name):
    model = build(name)
    opt = timm.optim.create_optimizer_v2(model, "adamw", lr=1e-3, layer_decay=0.75)
    named = dict(model.named_parameters())
    ids = [id(p) for group in opt.param_groups for p in group["params"]]
    assert sorted(ids) == sorted(id(p) for p in named.values())  # every parameter, once
    scale = {id(p): group["lr_scale"] for group in opt.param_groups for p in group["params"]}
    by_name = {n: scale[id(p)] for n, p in named.items()}
    depth = len(model.blocks)
    first = "tokenizer.prefix.cls_token" if "tokenizer.prefix.cls_token" in by_name else "tokenizer.weight"
    assert by_name[first] == 0.75 ** (depth + 1)
    block_scales = [max(v for n, v in by_name.items() if n.startswith(f"blocks.{i}.")) for i in range(depth)]
    assert block_scales == sorted(block_scales) and len(set(block_scales)) == depth
    assert by_name["head.fc.weight"] == 1.0
    loss = model(cfg_input(model)).square().mean()
    loss.backward()
    opt.step()


# ------------------------------------------------------------------------------------------------
# data config


@pytest.mark.parametrize("name", SQUARE_MODELS)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_resolved_data_config_transforms_a_pil_image_into_model_input(name, mode):
    torch.manual_seed(0)
    model = eqvit.create_model(name, in_chans=3 if mode == "RGB" else 1).eval()
    cfg = timm.data.resolve_data_config({}, model=model)
    assert cfg["input_size"] == (model.in_chans, *model.domain.shape)
    assert cfg["mean"] == cfg["std"] == (0.5,) * model.in_chans
    transform = timm.data.create_transform(**cfg)
    pixels = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    x = transform(image)
    assert x.shape == cfg["input_size"]
    assert -1.0 <= x.min() and x.max() <= 1.0  # [-1, 1], the range eqvit's image datasets use
    with torch.no_grad():
        out = model(x[None])
    assert out.shape == (1, model.num_classes) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["so3vit_tiny", "vit_ape_tiny", "s2transformer_tiny"])
@pytest.mark.parametrize("key", ["num_classes", "global_pool"])
def test_dense_models_refuse_classifier_arguments(name, key):
    """A dense model says why it takes no classifier argument and what to pass, through both registries."""
    value = 10 if key == "num_classes" else "avg"
    for create in (eqvit.create_model, timm.create_model):
        with pytest.raises(ValueError, match=rf"dense model.*no {key}.*out_chans="):
            create(name, **{key: value})


@pytest.mark.parametrize("name", ["o2vit_square_tiny", "platonic_image_tiny", "so3vit_tiny", "platonic_points_tiny"])
def test_builders_take_timms_placement_arguments(name):
    """timm passes device= and dtype= to every builder (its tests build on the meta device)."""
    meta = timm.create_model(name, device="meta")
    assert {p.device.type for p in meta.parameters()} == {"meta"}
    double = eqvit.create_model(name, dtype=torch.float64)
    assert {p.dtype for p in double.parameters()} == {torch.float64}
    torch.manual_seed(0)
    reference = eqvit.create_model(name).double().eval()
    torch.manual_seed(0)
    placed = eqvit.create_model(name, dtype=torch.float64).eval()
    x = reference.domain.random_input(2, reference.in_chans, dtype=torch.float64)
    x = x if isinstance(x, tuple) else (x,)
    with torch.no_grad():
        torch.testing.assert_close(placed(*x), reference(*x), rtol=0, atol=0)
