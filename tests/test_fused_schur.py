"""The inference forms of the Schur layers (eqvit.nn.fused_schur): the frozen linear as runs of batched
matmuls, the Fourier MLP with its hidden features in coefficient rows, in token chunks, coupled attention. Each
computes the training layer's function (float64) and stays equivariant; broken ones fail the check."""

from __future__ import annotations

import copy

import pytest
import torch
from randomise import randomise_
from torch import nn

import eqvit
from eqvit.groups import get_group
from eqvit.nn.activation import FourierActivation, homogeneous_fourier_basis
from eqvit.nn.fused_schur import FourierSlabMlp, FrozenSchurLinear, SchurCoupledAttention
from eqvit.nn.irrep_attention import IrrepAttention, coupled_heads, irrepwise_heads
from eqvit.nn.irrep_blocks import IrrepMlp, _rows_mlp, _schur_mlp
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.slabs import slab_runs
from eqvit.testing import EquivarianceError, assert_equivariant


def _mlp(group: str = "D4", copies: int = 3, hidden_copies: int = 5, act: nn.Module | None = None) -> IrrepMlp:
    G = get_group(group)
    V = FeatureType.regular(G, copies, layout="components")
    hidden, basis, _ = homogeneous_fourier_basis(G, [("regular", hidden_copies)], layout="components")
    return randomise_(IrrepMlp(V, FourierActivation(hidden, basis, act))).double()


def _slab(mlp: IrrepMlp, chunk_tokens: int) -> FourierSlabMlp:
    return FourierSlabMlp(FrozenSchurLinear(mlp.fc1), mlp.act, FrozenSchurLinear(mlp.fc2), chunk_tokens)


@pytest.mark.parametrize("group", ["D4", "C4", "D6", "D2"])
@pytest.mark.parametrize("chunk_tokens", [1, 3, 7, 512])
def test_same_function_as_the_training_form(group, chunk_tokens):
    mlp = _mlp(group)
    x = torch.randn(2, 7, mlp.in_type.dim, dtype=torch.float64)
    with torch.no_grad():
        expected, got = mlp(x), _slab(mlp, chunk_tokens)(x)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()


def test_other_pointwise_nonlinearity_and_empty_batch():
    mlp = _mlp(act=nn.SiLU())
    slab = _slab(mlp, 4)
    x = torch.randn(3, 5, mlp.in_type.dim, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(slab(x), mlp(x), rtol=0, atol=1e-12)
        assert slab(x[:0]).shape == (0, 5, mlp.in_type.dim)


def test_equivariant_from_its_types_and_a_broken_one_fails():
    slab = _slab(_mlp(), 4)
    assert slab.in_type == slab.out_type
    assert_equivariant(slab)
    broken = copy.deepcopy(slab)
    broken.to_values[0, 1] += 0.3  # no longer the Fourier transform: the GELU sees mixed values
    with pytest.raises(EquivarianceError):
        assert_equivariant(broken)


def test_refuses_a_non_strided_activation():
    mlp = _mlp()
    act = copy.deepcopy(mlp.act)
    act.strided = False
    with pytest.raises(ValueError, match="strided FourierActivation"):
        FourierSlabMlp(FrozenSchurLinear(mlp.fc1), act, FrozenSchurLinear(mlp.fc2))
    with pytest.raises(ValueError, match="chunk_tokens"):
        _slab(mlp, 0)


@pytest.mark.parametrize("name", ["o2vit_d4_small_patch16_tiny", "o2vit_c4_small_patch16_tiny"])
def test_fuse_uses_it_for_the_schur_models(name):
    model = randomise_(eqvit.create_model(name)).double().eval()
    fused = eqvit.fuse(model)
    assert all(isinstance(block.mlp, FourierSlabMlp) for block in fused.blocks)
    for block in fused.blocks:
        block.mlp.chunk_tokens = 5  # more than one chunk per image
    x = torch.randn(2, *model.pretrained_cfg["input_size"], dtype=torch.float64)
    with torch.no_grad():
        expected, got = model(x), fused(x)
    assert (got - expected).abs().max() <= 1e-10 * expected.abs().max()


def test_runs_of_the_regular_representation():
    """D4's four 1-d irreps are one run, the two components of E another; C4's complex E is its own slab."""
    for group, counts in (("D4", [4, 2]), ("C4", [2, 1]), ("D6", [4, 4])):
        lin = IrrepLinear(*(2 * [FeatureType.regular(get_group(group), 3, layout="components")]))
        assert [run.count for run in slab_runs(lin._in_sizes, lin._terms)] == counts


@pytest.mark.parametrize("group", ["D4", "C4", "D6", "D3"])
def test_frozen_schur_linear_with_zero_slabs(group):
    G = get_group(group)
    src = FeatureType(G, [2 + i for i in range(len(G.irreps))], layout="components")
    dst = FeatureType(G, [(i % 2) * 3 for i in range(len(G.irreps))], layout="components")  # some irreps absent
    for a, b in ((src, dst), (dst, src), (src, src)):
        lin = randomise_(IrrepLinear(a, b)).double()
        x = torch.randn(2, 3, a.dim, dtype=torch.float64)
        with torch.no_grad():
            assert torch.allclose(FrozenSchurLinear(lin)(x), lin(x), rtol=0, atol=1e-12)


def _coupled(group: str, copies: int, heads: int) -> IrrepAttention:
    V = FeatureType.regular(get_group(group), copies, layout="components")
    return randomise_(IrrepAttention(V, coupled_heads(V, heads))).double()


@pytest.mark.parametrize("group, copies, heads", [("D4", 4, 2), ("C4", 4, 4), ("D6", 2, 2), ("D2", 3, 3)])
def test_coupled_attention_same_function(group, copies, heads):
    attn = _coupled(group, copies, heads)
    fused = SchurCoupledAttention(attn)
    x = torch.randn(2, 7, attn.ftype.dim, dtype=torch.float64)
    with torch.no_grad():
        expected, got = attn(x, None, 1), fused(x)
    assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()
    assert_equivariant(fused)


def test_coupled_attention_broken_fails_and_refusals():
    fused = SchurCoupledAttention(_coupled("D4", 4, 2))
    broken = copy.deepcopy(fused)
    broken.qkv_weight_1[0, 0, 0] += 1.0  # one E component's query weight differs from the other's
    with pytest.raises(EquivarianceError):
        assert_equivariant(broken)
    V = FeatureType.regular(get_group("D4"), 4, layout="components")
    with pytest.raises(ValueError, match="coupled heads"):
        SchurCoupledAttention(IrrepAttention(V, irrepwise_heads(V, 2)))


@pytest.mark.parametrize("group", ["D4", "C4", "D6"])
def test_rows_mlp_gradients_match_autograd(group):
    """The training MLP on coefficient rows (its own backward, one saved hidden tensor) has autograd's
    gradients for the input and every parameter (float64)."""
    mlp = _mlp(group)
    x = torch.randn(2, 5, mlp.in_type.dim, dtype=torch.float64, requires_grad=True)
    grads = {}
    for impl in (_schur_mlp, _rows_mlp):
        mlp.zero_grad(set_to_none=True)
        x.grad = None
        out = impl(mlp, x)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads[impl] = [x.grad.clone()] + [p.grad.clone() for p in mlp.parameters()]
    for a, b in zip(grads[_schur_mlp], grads[_rows_mlp]):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    assert mlp._impl is _rows_mlp
    torch.autograd.gradcheck(lambda t: _rows_mlp(mlp, t), (x[:1, :2].detach().requires_grad_(),))


def test_rows_mlp_keeps_one_hidden_tensor():
    mlp = _mlp("D4", copies=4, hidden_copies=16)
    x = torch.randn(3, 7, mlp.in_type.dim, dtype=torch.float64, requires_grad=True)
    hidden_numel = 3 * 7 * mlp.fc1.out_type.dim

    def saved_hidden(impl) -> int:
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            impl(mlp, x)
        return sum(1 for n in storages.values() if n == hidden_numel)

    assert saved_hidden(_schur_mlp) == 2 and saved_hidden(_rows_mlp) == 1


def test_rows_mlp_under_autocast():
    mlp = _mlp("D4").float()
    x = torch.randn(2, 5, mlp.in_type.dim, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _rows_mlp(mlp, x)
    out.float().sum().backward()
    assert x.grad.dtype == torch.float32 and all(p.grad.dtype == torch.float32 for p in mlp.parameters())
    with torch.no_grad():
        assert (out.float() - _schur_mlp(mlp, x)).abs().max() <= 0.05 * out.float().abs().max()


def test_flop_counter_sees_every_matmul():
    """``FlopCounterMode`` counts the fused MLP at the Schur minimum plus the two transforms (an in-place
    ``baddbmm_`` would slip past it: the accumulating rows use the counted ``out=`` form)."""
    from torch.utils.flop_counter import FlopCounterMode

    mlp = _mlp("D4", copies=3, hidden_copies=5)
    slab = _slab(mlp, 512)
    T = 7
    x = torch.randn(T, mlp.in_type.dim, dtype=torch.float64)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        slab(x)
    schur = sum(m.numel() for m in mlp.fc1.schur_mats() + mlp.fc2.schur_mats() if m is not None)
    s, n = slab.num_rows, slab.row_width
    assert counter.get_total_flops() == 2 * T * schur + 2 * (2 * s * s * n * T)
