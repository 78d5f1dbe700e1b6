"""Generic model tests, timm-style: parametrized over the registry, so registering a model tests it.

Every registered name is mapped to its family's ``<family>_tiny`` variant when one is registered
(``so3vit_4x512 -> so3vit_tiny``, ``s2transformer_8x256 -> s2transformer_tiny``), and the
results are deduplicated; a family without a tiny variant is tested at its own size.

Note on equivariance checks: timm's small-std initialisation leaves some paths nearly silent, and
a zero output would make any check vacuous (``assert_equivariant`` refuses it). Every
equivariance check here therefore first adds random noise to all weights (:func:`randomise_`) and
asserts that the output is clearly non-zero.
"""

from __future__ import annotations

import copy
import inspect
import re

import numpy as np
import pytest
import timm
import torch
from helpers import TEST_MODELS, build, call, output_shape, random_input, randomise_
from torch import nn

import eqvit
from eqvit.geometry import icosphere
from eqvit.geometry.domain import PointDomain
from eqvit.groups import get_group
from eqvit.models import is_model
from eqvit.models import so3vit as so3vit_module
from eqvit.models.vit import EquivariantViT
from eqvit.nn.posenc import SO3RoPE
from eqvit.testing import EquivarianceError, assert_equivariant

SO3VIT_NAMES = [
    "so3vit_tiny",
    "so3vit_4x128",
    "so3vit_4x256",
    "so3vit_4x512",
    "so3vit_16x512",
    "so3vit_32x512",
]


def _z_rotations(group) -> np.ndarray:
    return np.abs(group.elements[:, :, 2] - np.array([0.0, 0.0, 1.0])).max(-1) < 1e-9


# ------------------------------------------------------------------------------------------------
# generic: every registered family


def test_registry_is_not_empty():
    assert "so3vit_tiny" in TEST_MODELS
    assert all(is_model(name) for name in TEST_MODELS)


@pytest.mark.parametrize("name", TEST_MODELS)
def test_forward_backward(name):
    model = randomise_(build(name)).train()
    x = random_input(model)
    out = call(model, x)
    assert out.shape == output_shape(model, 2)
    assert torch.isfinite(out).all()
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {bad}"
    zero = [n for n, p in model.named_parameters() if p.grad is not None and not p.grad.any()]
    assert not zero, f"exactly zero gradients in {zero}"


@pytest.mark.parametrize("name", TEST_MODELS)
def test_forward_as_built(name):
    """Default init (no randomisation): right shape, finite, deterministic in eval mode."""
    model = build(name).eval()
    x = random_input(model, batch=1)
    with torch.no_grad():
        a, b = call(model, x), call(model, x)
    assert a.shape == output_shape(model, 1)
    assert torch.isfinite(a).all() and torch.equal(a, b)


@pytest.mark.parametrize("name", TEST_MODELS)
def test_model_can_be_deep_copied(name):
    """assert_equivariant copies the model before casting it; EMA copies it too."""
    model = eqvit.create_model(name)
    clone = copy.deepcopy(model)
    assert type(clone) is type(model)
    for (k, a), (_, b) in zip(model.state_dict().items(), clone.state_dict().items()):
        assert torch.equal(a, b), k
        assert a.data_ptr() != b.data_ptr() or a.numel() == 0, k


@pytest.mark.parametrize("name", TEST_MODELS)
def test_equivariant_to_declared_group(name):
    model = build(name)
    if model.group is None:
        pytest.skip(f"{name} declares no symmetry (group is None)")
    randomise_(model)
    with torch.no_grad():
        y = call(copy.deepcopy(model).double().eval(), random_input(model, dtype=torch.float64))
    assert y.abs().max() > 1e-2, "output is (near) zero: the equivariance check would be vacuous"
    report = assert_equivariant(model)  # float64, default tolerance 1e-10
    assert report.passed and len(report.rows) == model.group.order


# ------------------------------------------------------------------------------------------------
# SO3ViT: symmetry breaking and broken models (proves the check can fail)


def test_so3vit_tiny_declares_icosahedral_group():
    model = build("so3vit_tiny")
    assert model.group.order == 60
    assert np.allclose(model.group.elements, get_group("I").elements, atol=0)


def test_so3vit_latitude_keeps_exactly_C5():
    torch.manual_seed(0)
    model = eqvit.create_model("so3vit_tiny", symmetry_breaking="latitude")
    group = model.group
    assert group.order == 5
    # All five elements are rotations about z: they fix e3 and the xy-plane.
    assert np.allclose(group.elements[:, :, 2], [0.0, 0.0, 1.0], atol=1e-12)
    assert np.allclose(group.elements[:, 2, :], [0.0, 0.0, 1.0], atol=1e-12)
    assert np.allclose(np.linalg.det(group.elements), 1.0, atol=1e-12)
    randomise_(model, skip=("input_encoding",))
    torch.nn.init.normal_(model.input_encoding.weight)
    assert_equivariant(model)  # C5, float64, 1e-10
    I = get_group("I")
    with pytest.raises(EquivarianceError) as info:
        assert_equivariant(model, I, batch_size=1)
    # Exactly the five rotations about z pass; the other 55 elements of I fail.
    tol = info.value.report.tolerance
    passed = np.array([rel <= tol for _, _, rel in info.value.report.rows])
    assert np.array_equal(passed, _z_rotations(I))
    assert min(rel for (_, _, rel), ok in zip(info.value.report.rows, passed) if not ok) > 1e-3


class _TokenBias(nn.Module):
    """A learned vector per token position: breaks the permutation of tokens by the group."""

    def __init__(self, num_tokens: int, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(num_tokens, dim, generator=torch.Generator().manual_seed(3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def _break(model: EquivariantViT, how: str) -> None:
    if how == "token_bias":
        model.tokenizer = nn.Sequential(model.tokenizer, _TokenBias(model.tokenizer.num_tokens, model.embed_dim))
    elif how == "shuffled_poses":
        # A new SO3RoPE on permuted poses (assigning to ``posenc.pi`` would be undone by ``.double()``,
        # which re-derives the buffer from its float64 master).
        perm = torch.randperm(model.tokenizer.num_tokens, generator=torch.Generator().manual_seed(4))
        head_dim = model.posenc.head_dim
        model.posenc = model.rope = SO3RoPE(head_dim, poses=model.tokenizer.poses[perm])
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["token_bias", "shuffled_poses"])
def test_broken_so3vit_fails_equivariance(how):
    model = randomise_(build("so3vit_tiny"))
    _break(model, how)
    with pytest.raises(EquivarianceError) as info:
        assert_equivariant(model, batch_size=1)
    text = str(info.value)
    assert "NOT equivariant" in text and "FAIL" in text
    first = text.splitlines()[3]  # the identity row of the table (after verdict, header, rule)
    assert "identity" in first and first.rstrip().endswith("ok")


# ------------------------------------------------------------------------------------------------
# registry and timm


@pytest.mark.parametrize("name", TEST_MODELS)
def test_timm_create_model_builds_the_same_model(name):
    ours = build(name)
    torch.manual_seed(0)
    theirs = timm.create_model(name)
    assert type(theirs) is type(ours)
    assert {k: v.shape for k, v in theirs.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}
    assert getattr(theirs, "config", None) == getattr(ours, "config", None)


@pytest.mark.parametrize("name", TEST_MODELS)
def test_pretrained_is_refused(name):
    with pytest.raises(ValueError, match="pretrained"):
        eqvit.create_model(name, pretrained=True)
    with pytest.raises(ValueError, match="pretrained"):
        timm.create_model(name, pretrained=True)


def test_unknown_model_name_suggests_close_match():
    with pytest.raises(ValueError, match="so3vit_tiny") as info:
        eqvit.create_model("so3vit_tiyn")
    assert "so3vit_tiyn" in str(info.value)
    assert not isinstance(info.value, KeyError)


def test_list_models_filters():
    names = eqvit.list_models("so3vit*")
    assert set(SO3VIT_NAMES) <= set(names)
    assert names == sorted(names) and all(n.startswith("so3vit") for n in names)
    assert set(names) <= set(eqvit.list_models())
    assert eqvit.list_models("no_such_family*") == []


def _so3vit_kwargs(name: str, monkeypatch) -> dict:
    """The full keyword set ``build_so3vit`` gets for ``name``, without building the model."""
    captured = {}

    def fake_build(**kwargs):
        captured.update(kwargs)
        return nn.Module()

    monkeypatch.setattr(so3vit_module, "build_so3vit", fake_build)
    eqvit.create_model(name)
    monkeypatch.undo()
    bound = inspect.signature(so3vit_module.build_so3vit).bind(**captured)
    bound.apply_defaults()
    return dict(bound.arguments)


@pytest.mark.parametrize("name", SO3VIT_NAMES)
def test_so3vit_sizes(name, monkeypatch):
    """``so3vit_{depth}x{width}`` (the seed's Table 1) has that depth and width."""
    kwargs = _so3vit_kwargs(name, monkeypatch)
    if name == "so3vit_tiny":
        depth, width, levels = 2, 32, (3, 1)
    else:
        depth, width = (int(v) for v in re.fullmatch(r"so3vit_(\d+)x(\d+)", name).groups())
        levels = (5, 2)  # 960 tokens, as in the seed
    assert (kwargs["depth"], kwargs["embed_dim"]) == (depth, width)
    assert (kwargs["input_level"], kwargs["patch_level"]) == levels
    assert kwargs["embed_dim"] % kwargs["num_heads"] == 0
    if depth * width <= 4 * 256:  # cheap enough to build for real (on the small grid)
        model = eqvit.create_model(name, input_level=3, patch_level=1)
        assert len(model.blocks) == depth and model.embed_dim == width
        assert model.blocks[0].attn.num_heads == kwargs["num_heads"]
        assert model.config["depth"] == depth and model.config["embed_dim"] == width


def test_wrong_input_shape_is_a_value_error():
    model = build("so3vit_tiny")
    expected = re.escape("expected input of shape [B, 3, 642] on icosphere level 3")
    for shape in [(2, 3, 100), (2, 4, 642), (3, 642), (2, 3, 642, 1)]:
        with pytest.raises(ValueError, match=expected) as info:
            model(torch.randn(shape))
        assert f"got {list(shape)}" in str(info.value)


@pytest.mark.parametrize("name", TEST_MODELS)
def test_fused_attention_matches_reference(name):
    fused = build(name)
    if not isinstance(fused, EquivariantViT):
        pytest.skip(f"{name} is not an EquivariantViT (no fused_attn switch)")
    randomise_(fused).eval().double()  # float64: the two paths' agreement, not float32's rounding
    torch.manual_seed(0)
    reference = eqvit.create_model(name, fused_attn=False).eval().double()
    reference.load_state_dict(fused.state_dict())
    assert all(b.attn.fused for b in fused.blocks) and not any(b.attn.fused for b in reference.blocks)
    x = random_input(fused, dtype=torch.float64)
    with torch.no_grad():
        a, b = call(fused, x), call(reference, x)
    assert a.abs().max() > 1e-2
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------------------------------
# assert_equivariant itself


class _OnSphere(nn.Module):
    """A field model on icosphere(2) that declares the icosahedral group."""

    def __init__(self, mixing: bool) -> None:
        super().__init__()
        sphere = icosphere(2)
        self.domain = PointDomain(sphere.vertices, name="icosphere level 2")
        self.group = get_group("I")
        self.in_chans = 2
        gen = torch.Generator().manual_seed(5)
        self.pointwise = nn.Conv1d(2, 3, 1)  # the same channel map at every point
        self.mix = (
            nn.Parameter(torch.randn(sphere.num_vertices, sphere.num_vertices, generator=gen)) if mixing else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.pointwise(x))
        return y @ self.mix if self.mix is not None else y


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_assert_equivariant_passes_on_pointwise_module(dtype):
    report = assert_equivariant(_OnSphere(mixing=False), dtype=dtype)
    assert report.passed and len(report.rows) == 60
    assert "FAIL" not in report.table()
    assert report.max_relative_error <= (1e-10 if dtype == torch.float64 else 1e-5)


def test_assert_equivariant_raises_on_point_mixing_module():
    with pytest.raises(EquivarianceError) as info:
        assert_equivariant(_OnSphere(mixing=True))
    report = info.value.report
    assert not report.passed and len(report.rows) == 60
    table = report.table()
    assert "FAIL" in table and "FAIL" in str(info.value)
    assert sum("FAIL" in line for line in table.splitlines()) == 59  # all but the identity
    assert report.rows[0][2] == 0.0
