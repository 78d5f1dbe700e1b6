"""The ``components`` layout: Schur block-matmul linears, attention, Fourier MLP, the ViT-scale models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import eqvit
from eqvit.groups import get_group
from eqvit.models import is_model
from eqvit.nn.activation import FourierActivation, homogeneous_fourier_basis
from eqvit.nn.irrep_attention import IrrepAttention, coupled_heads, irrepwise_heads
from eqvit.nn.irrep_blocks import IrrepMlp
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.schur import apply_slabs
from eqvit.testing import EquivarianceError, assert_equivariant

GROUPS = ["D4", "C4", "D6", "O"]  # real-type 2-d irreps, complex type, two 2-d irreps, 3-d irreps


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.mark.parametrize("group", GROUPS)
def test_components_type_is_a_representation(group):
    G = get_group(group)
    V = FeatureType.regular(G, 2, layout="components")
    R = V.representation
    for g in range(G.order):
        for h in range(G.order):
            np.testing.assert_allclose(R[g] @ R[h], R[G.cayley[g, h]], atol=1e-12)
    x = torch.randn(3, V.dim)
    torch.testing.assert_close(V.join(V.split(x)), x, rtol=0, atol=0)
    # The same representation as the copies layout, up to the coordinate permutation of the blocks.
    W = V.with_layout("copies")
    perm = np.concatenate([V.block_coords(i).reshape(-1) for i, *_ in V.blocks()])
    ref = np.concatenate([W.block_coords(i).reshape(-1) for i, *_ in W.blocks()])
    np.testing.assert_allclose(R[:, perm][:, :, perm], W.representation[:, ref][:, :, ref], atol=1e-12)


@pytest.mark.parametrize("group", GROUPS)
def test_components_fourier_intertwines(group):
    G = get_group(group)
    frames = FeatureType.frames(G, 2, layout="components")
    irrep = frames.in_irrep_basis()
    assert irrep.layout == "components"
    x = torch.randn(2, frames.dim)
    for g in range(G.order):
        torch.testing.assert_close(frames.to_irrep_basis(frames.act(g, x)), irrep.act(g, frames.to_irrep_basis(x)))


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("layouts", [("components", "components"), ("copies", "components"), ("components", "copies")])
def test_schur_linear_matches_dense_and_is_equivariant(group, layouts):
    G = get_group(group)
    a, b = FeatureType.regular(G, 3, layout=layouts[0]), FeatureType.regular(G, 2, layout=layouts[1])
    lin = IrrepLinear(a, b)
    assert lin.schur == (layouts == ("components", "components"))
    with torch.no_grad():
        lin.bias.normal_()
    x = torch.randn(2, 4, a.dim)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight_matrix(), lin.bias_vector()))
    torch.testing.assert_close(lin(x), lin.forward_blockwise(x))
    assert_equivariant(lin)
    other = IrrepLinear(a, b)
    other.load_dense_(lin.weight_matrix().detach(), lin.bias_vector().detach())
    torch.testing.assert_close(other(x), lin(x))


def test_schur_linear_detects_a_broken_weight():
    V = FeatureType.regular(get_group("D4"), 2, layout="components")
    lin = IrrepLinear(V, V)
    assert_equivariant(lin)
    good = IrrepLinear.schur_mats(lin)
    # The two components of the E irrep must share their matrix; give the second its own.
    second = [t for t, n in enumerate(lin._term_blocks) if lin._term_blocks.count(n) == 2][1]
    lin.schur_mats = lambda: [torch.randn(m.shape) if t == second else m for t, m in enumerate(good)]
    with pytest.raises(EquivarianceError):
        assert_equivariant(lin)


@pytest.mark.parametrize(("group", "ratio"), [("D4", 12 / 64), ("C4", 6 / 16), ("D6", 20 / 144)])
def test_schur_linear_costs_the_schur_minimum(group, ratio):
    V = FeatureType.regular(get_group(group), 6, layout="components")
    lin = IrrepLinear(V, V, bias=False)
    x = torch.randn(10, V.dim)
    mats, biases = lin.schur_mats(), lin.schur_biases()  # (the two-matrix forms are built once per call)
    with FlopCounterMode(display=False) as counter:
        y = apply_slabs(x, lin.plan, mats, biases)
    torch.testing.assert_close(y, lin(x))
    assert counter.get_total_flops() == round(ratio * 2 * 10 * V.dim**2)


@pytest.mark.parametrize("group", ["D4", "C4", "D6"])
def test_strided_fourier_activation(group):
    G = get_group(group)
    ftype, basis, _ = homogeneous_fourier_basis(G, [("regular", 3)], layout="components")
    act = FourierActivation(ftype, basis)
    assert act.strided
    x = torch.randn(2, 5, ftype.dim)
    torch.testing.assert_close(act(x), act.forward_dense(x))
    assert_equivariant(act)
    copies = FourierActivation(*homogeneous_fourier_basis(G, [("regular", 3)])[:2])
    assert not copies.strided  # orbits interleaved: the gathered path


@pytest.mark.parametrize("group", ["D4", "C4"])
def test_schur_attention_and_mlp_match_the_dense_forms(group):
    G = get_group(group)
    V = FeatureType.regular(G, 4, layout="components")
    attn = IrrepAttention(V, coupled_heads(V, 2))
    assert attn.schur
    for lin in (attn.q, attn.k, attn.v):
        with torch.no_grad():
            lin.bias.normal_()
    x = torch.randn(2, 5, V.dim)
    torch.testing.assert_close(attn(x), attn.attend(x, *attn.stacked_weights()))
    assert_equivariant(attn)
    gathered = IrrepAttention(V, irrepwise_heads(V, 2))  # heads laid out by index_select
    assert gathered.schur and gathered.slab_heads is None and attn.slab_heads is not None
    torch.testing.assert_close(gathered(x), gathered.attend(x, *gathered.stacked_weights()))
    assert_equivariant(gathered)
    hidden, basis, _ = homogeneous_fourier_basis(G, [("regular", 8)], layout="components")
    mlp = IrrepMlp(V, FourierActivation(hidden, basis))
    assert mlp.schur
    torch.testing.assert_close(mlp(x), mlp.forward_reference(x))
    torch.testing.assert_close(mlp(x), mlp.forward_with(x, *mlp.folded_weights()))


SCALE = [
    "o2vit_d4_small_patch16_224",
    "o2vit_d4_base_patch16_224",
    "o2vit_c4_small_patch16_224",
    "o2vit_d6_small_hex",
    "platonic_d4_small_patch16_224",
    "platonic_d4_base_patch16_224",
]


def test_scale_models_registered_with_tiny_twins():
    for name in SCALE:
        assert is_model(name)
        assert is_model(name.rsplit("_", 1)[0] + "_tiny"), name


def test_scale_model_config_and_schur_layout():
    model = eqvit.create_model("o2vit_d4_small_patch16_224")
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (3, 224, 224) and cfg["num_classes"] == 1000
    assert tuple(cfg["mean"]) == tuple(cfg["std"]) == (0.5,) * 3
    assert model.embed_dim == 384 and len(model.blocks) == 12
    block = model.blocks[0]
    assert block.attn.schur and block.mlp.schur and block.mlp.act.strided
    assert block.attn.num_heads == 6


@pytest.mark.parametrize("name", ["o2vit_d4_small_patch16_tiny", "o2vit_c4_small_patch16_tiny"])
def test_tiny_twin_fp32_invariance(name):
    torch.set_default_dtype(torch.float32)
    model = eqvit.create_model(name).eval()
    assert_equivariant(model, dtype=torch.float32, tolerance=1e-5)


def test_training_memory_counts_parameters_and_adamw_state():
    from eqvit.bench.scale_speed import training_memory_mb

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10))
    params = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    x, target = torch.randn(4, 256), torch.randint(0, 10, (4,))
    total = training_memory_mb(model, x, target)
    # parameters, two AdamW moments and the gradients at least; AdamW's per-parameter temporaries at most
    assert 4 * params <= total <= 6 * params + 1


def test_scale_speed_quick(tmp_path, capsys):
    from eqvit.bench.scale_speed import main

    out = tmp_path / "scale.json"
    main(["--quick", "--sizes", "small", "--profile", "--octic", str(tmp_path / "no_peer"), "--out", str(out)])
    result = json.loads(out.read_text())
    info = result["sizes"]["small"]["info"]
    assert set(info) == {"timm", "eqvit_d4", "platonic_d4"}
    assert info["eqvit_d4"]["flops_ratio"] < 0.35  # the Schur linears, even at depth 2 and 16 tokens
    assert info["eqvit_d4"]["invariance_fp32"] < 1e-4
    assert result["sizes"]["small"]["training"]["models"]["eqvit_d4"]["ratio"] > 0
    for m in result["sizes"]["small"]["training"]["models"].values():  # the total holds parameters and AdamW state
        assert m["training_memory_mb"] > m["peak_allocated_mb"]
    profile = result["sizes"]["small"]["profiles"]["eqvit_d4 b=1"]
    assert profile and all(row["self_ms"] >= 0 for row in profile) and sum(row["share"] for row in profile) <= 1.0001
    printed = capsys.readouterr().out
    assert "skipped octic" in printed and "FLOPs / timm" in printed and "profile, folded eqvit_d4 b=1" in printed


def test_compiled_training_times_every_model_and_records_one_that_fails():
    from eqvit.bench.scale_speed import compiled_training

    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("not this model")

    models = {"timm": nn.Linear(8, 4), "eqvit_d4": nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))}
    out = compiled_training({**models, "broken": Broken()}, torch.randn(2, 8), torch.tensor([0, 3]), rounds=1)
    timed = out["models"]
    assert timed["timm"]["ratio"] == 1.0 and timed["eqvit_d4"]["ratio"] > 0
    assert timed["timm"]["first_call_s"] > 0 and timed["eqvit_d4"]["first_call_s"] > 0
    assert "not this model" in timed["broken"]["error"] and "ratio" not in timed["broken"]


def test_compile_train_without_the_training_step_is_a_usage_error(tmp_path, capsys):
    from eqvit.bench.scale_speed import main

    with pytest.raises(SystemExit) as exc:
        main(["--compile-train", "--no-train", "--out", str(tmp_path / "never.json")])
    assert exc.value.code == 2 and "--no-train" in capsys.readouterr().err
    assert not (tmp_path / "never.json").exists()


def test_peer_folder_follows_the_environment_then_the_checkout(monkeypatch, tmp_path):
    from eqvit.bench import _paths

    monkeypatch.setenv("EQVIT_PEERS", str(tmp_path))
    assert _paths.peers_dir() == tmp_path
    monkeypatch.delenv("EQVIT_PEERS")
    monkeypatch.setattr(_paths, "repo_root", lambda: tmp_path / "checkout")
    assert _paths.peers_dir() == tmp_path / "shared" / "peers"  # ../shared/peers beside the checkout
    monkeypatch.setattr(_paths, "repo_root", lambda: None)  # a wheel install: no default, the column is skipped
    assert _paths.peers_dir() is None


def _saved_units(module: torch.nn.Module, x: torch.Tensor) -> float:
    """Bytes that autograd keeps for backward (distinct storages other than ``x``'s), in units of ``x``."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    storages.pop(x.untyped_storage().data_ptr(), None)
    return sum(storages.values()) / (x.numel() * x.element_size())


def test_attention_keeps_no_reordered_copy_of_the_heads_for_backward():
    """q, k, v and SDPA's output are four units of the input's size; the projection reads the heads in
    place (coupled heads: per-piece matmuls on views; Fourier Platonic: the transform back recomputed), so
    no fifth unit, a reordered copy of the heads, is kept."""
    from eqvit.nn.platonic import FourierPlatonicAttention

    G = get_group("D4")
    V = FeatureType.regular(G, 8, layout="components")
    frames = FourierPlatonicAttention(G, 16, 2)
    for attn in (IrrepAttention(V, coupled_heads(V, 2)), frames):
        x = torch.randn(2, 50, attn.in_type.dim, requires_grad=True)
        assert 4 <= _saved_units(attn, x) < 5


@pytest.mark.parametrize("group", ["D4", "C4", "D6"])
def test_coupled_heads_projection_gradients_match_the_dense_form(group):
    """The coupled-heads projection's hand-written backward (project_heads) against autograd through the
    dense stacked weights, biases included."""
    G = get_group(group)
    V = FeatureType.regular(G, 4, layout="components")
    attn = IrrepAttention(V, coupled_heads(V, 2)).double()
    assert attn.slab_heads is not None
    with torch.no_grad():
        for lin in (attn.q, attn.k, attn.v, attn.proj):
            lin.bias.normal_()
    x = torch.randn(2, 5, V.dim, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 5, V.dim, dtype=torch.float64)
    grads = []
    for forward in (attn, lambda t: attn.attend(t, *attn.stacked_weights())):
        x.grad = None
        attn.zero_grad(set_to_none=True)
        (forward(x) * weight).sum().backward()
        grads.append([x.grad.clone()] + [p.grad.clone() for p in attn.parameters()])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
