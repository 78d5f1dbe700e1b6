"""Schur slabs (:mod:`eqvit.nn.schur`): the structured products behind the ``components``-layout linears and the
Fourier MLP, in training (autograd through standard ops) and folded. Each computes the dense layer's function
(float64), costs the Schur minimum, and a broken one fails the equivariance check."""

from __future__ import annotations

import pytest
import torch
from helpers import randomise_
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import eqvit
from eqvit.groups import get_group
from eqvit.nn.activation import FourierActivation, homogeneous_fourier_basis
from eqvit.nn.folded import FoldedSchurLinear
from eqvit.nn.irrep_blocks import IrrepMlp, _rows_mlp, _schur_mlp, rows_mlp_applies
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.schur import apply_slabs, rows_in, rows_out, slab_plan
from eqvit.testing import EquivarianceError, assert_equivariant


def _mlp(group: str = "D4", copies: int = 3, hidden_copies: int = 5, act: nn.Module | None = None) -> IrrepMlp:
    G = get_group(group)
    V = FeatureType.regular(G, copies, layout="components")
    hidden, basis, _ = homogeneous_fourier_basis(G, [("regular", hidden_copies)], layout="components")
    return randomise_(IrrepMlp(V, FourierActivation(hidden, basis, act))).double()


def test_slab_plan_of_the_regular_representation():
    """D4: four 1-d irreps and the two components of E (one matrix shared); C4's complex E is one slab."""
    for group, slabs in (("D4", 6), ("C4", 3), ("D6", 8)):
        V = FeatureType.regular(get_group(group), 3, layout="components")
        plan = slab_plan(V, V)
        assert len(plan.terms) == slabs and plan.out_dim == V.dim and sum(plan.in_sizes) == V.dim
        assert [s for s, _ in plan.terms] == list(range(slabs))


@pytest.mark.parametrize("group", ["D4", "C4", "D6", "D3"])
def test_linears_with_absent_irreps(group):
    """Output slabs of irreps the input lacks are zero; the folded linear computes the same."""
    G = get_group(group)
    src = FeatureType(G, [2 + i for i in range(len(G.irreps))], layout="components")
    dst = FeatureType(G, [(i % 2) * 3 for i in range(len(G.irreps))], layout="components")
    for a, b in ((src, dst), (dst, src), (src, src)):
        lin = randomise_(IrrepLinear(a, b)).double()
        x = torch.randn(2, 3, a.dim, dtype=torch.float64)
        weight, bias = lin.dense()
        with torch.no_grad():
            expected = torch.nn.functional.linear(x, weight, bias)
            torch.testing.assert_close(lin(x), expected, rtol=0, atol=1e-12)
            folded = lin.fold()
            assert isinstance(folded, FoldedSchurLinear) and (folded.in_type, folded.out_type) == (a, b)
            torch.testing.assert_close(folded(x), expected, rtol=0, atol=1e-12)
            folded_weight, folded_bias = folded.dense()
            torch.testing.assert_close(folded_weight, weight, rtol=0, atol=0)
            assert (folded_bias is None) == (bias is None)
            if bias is not None:
                torch.testing.assert_close(folded_bias, bias, rtol=0, atol=0)


@pytest.mark.parametrize("group", ["D4", "C4", "O"])
def test_rows_are_the_output_cut_into_rows(group):
    V = FeatureType.regular(get_group(group), 4, layout="components")
    lin = randomise_(IrrepLinear(V, V)).double()
    x = torch.randn(5, V.dim, dtype=torch.float64)
    n = 2
    rows = rows_out(x, lin.plan, *lin.slab_weights(), n)
    y = apply_slabs(x, lin.plan, *lin.slab_weights())
    torch.testing.assert_close(rows.permute(1, 0, 2).reshape(5, -1), y, rtol=0, atol=1e-12)
    torch.testing.assert_close(rows_in(rows, lin.plan, *lin.slab_weights()), lin(y), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="whole rows"):
        rows_out(x, lin.plan, *lin.slab_weights(), 3)


@pytest.mark.parametrize("group", ["D4", "C4", "D6", "D2"])
def test_rows_mlp_is_the_chain(group):
    mlp = _mlp(group)
    assert mlp._impl is _rows_mlp
    x = torch.randn(2, 7, mlp.in_type.dim, dtype=torch.float64)
    with torch.no_grad():
        expected, got = _schur_mlp(mlp, x), mlp(x)
        torch.testing.assert_close(got, mlp.forward_reference(x), rtol=0, atol=1e-11)
        assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()
        assert mlp(x[:0]).shape == (0, 7, mlp.in_type.dim)


def test_rows_mlp_with_another_nonlinearity_and_when_it_does_not_apply():
    mlp = _mlp(act=nn.SiLU())
    x = torch.randn(3, 5, mlp.in_type.dim, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), _schur_mlp(mlp, x), rtol=0, atol=1e-12)
    mlp.act.strided = False  # values not stored as strided copies: the row form would mix them
    assert not rows_mlp_applies(mlp.fc1, mlp.act, mlp.fc2)


@pytest.mark.parametrize("group", ["D4", "C4", "D6"])
def test_rows_mlp_gradients_match_the_chain(group):
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
    torch.autograd.gradcheck(lambda t: _rows_mlp(mlp, t), (x[:1, :2].detach().requires_grad_(),))


def test_rows_mlp_under_autocast():
    mlp = _mlp("D4").float()
    x = torch.randn(2, 5, mlp.in_type.dim, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mlp(x)
    out.float().sum().backward()
    assert x.grad.dtype == torch.float32 and all(p.grad.dtype == torch.float32 for p in mlp.parameters())
    with torch.no_grad():
        assert (out.float() - _schur_mlp(mlp, x)).abs().max() <= 0.05 * out.float().abs().max()


def test_rows_mlp_costs_the_schur_minimum_and_two_transforms():
    mlp = _mlp("D4", copies=3, hidden_copies=5)
    T = 7
    x = torch.randn(T, mlp.in_type.dim, dtype=torch.float64)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        mlp(x)
    schur = sum(m.numel() for m in mlp.fc1.schur_mats() + mlp.fc2.schur_mats() if m is not None)
    s = mlp.act.slab_inverse.shape[0]
    n = mlp.act.in_type.dim // s
    assert counter.get_total_flops() == 2 * T * schur + 2 * (2 * s * s * n * T)


def test_folded_mlp_is_equivariant_and_a_broken_one_fails():
    mlp = _mlp()
    folded = eqvit.fold(mlp)
    assert folded.in_type == folded.out_type == mlp.in_type
    assert isinstance(folded.fc1, FoldedSchurLinear)
    assert_equivariant(folded)
    with torch.no_grad():
        folded.fc1.mat_1.add_(0.3 * torch.randn_like(folded.fc1.mat_1))
        folded.act.slab_inverse[0, 1] += 0.3  # no longer the Fourier transform: the GELU sees mixed values
    with pytest.raises(EquivarianceError):
        assert_equivariant(folded)
