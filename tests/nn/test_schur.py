"""Schur slabs (:mod:`eqvit.nn.schur`): the structured products behind the ``components``-layout linears and the
Fourier MLP, in training (autograd through standard ops) and folded. Each computes the dense layer's function
(float64), costs the Schur minimum, and a broken one fails the equivariance check."""

from __future__ import annotations

import pytest
import torch
from helpers import randomise_
from torch import nn

import eqvit
from eqvit.groups import get_group
from eqvit.nn.activation import FourierActivation, homogeneous_fourier_basis
from eqvit.nn.folded import FoldedSchurLinear
from eqvit.nn.irrep_blocks import IrrepMlp, _lean_rows_mlp, _rows_mlp, _schur_mlp
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.rows_mlp import rows_mlp_applies
from eqvit.nn.schur import apply_slabs, rows_in, rows_out, slab_plan
from eqvit.testing import EquivarianceError, assert_equivariant
from eqvit.utils import flop_counter


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
    assert mlp._impl is _lean_rows_mlp  # GELU: the lean form
    x = torch.randn(2, 7, mlp.in_type.dim, dtype=torch.float64)
    with torch.no_grad():
        expected = _schur_mlp(mlp, x)
        for impl in (_rows_mlp, _lean_rows_mlp):
            got = impl(mlp, x)
            torch.testing.assert_close(got, mlp.forward_reference(x), rtol=0, atol=1e-11)
            assert (got - expected).abs().max() <= 1e-12 * expected.abs().max()
            assert impl(mlp, x[:0]).shape == (0, 7, mlp.in_type.dim)


def test_rows_mlp_with_another_nonlinearity_and_when_it_does_not_apply():
    for act, impl in ((nn.SiLU(), _lean_rows_mlp), (nn.GELU("tanh"), _lean_rows_mlp), (nn.Tanh(), _rows_mlp)):
        mlp = _mlp(act=act)
        assert mlp._impl is impl  # tanh: no derivative known to the lean form, the autograd chain
        x = torch.randn(3, 5, mlp.in_type.dim, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(mlp(x), _schur_mlp(mlp, x), rtol=0, atol=1e-12)
    mlp.act.strided = False  # values not stored as strided copies: the row form would mix them
    assert not rows_mlp_applies(mlp.fc1, mlp.act, mlp.fc2)


@pytest.mark.parametrize("group", ["D4", "C4", "D6"])
@pytest.mark.parametrize("act", [nn.GELU(), nn.GELU("tanh"), nn.SiLU(), nn.ReLU()], ids=str)
def test_rows_mlp_gradients_match_the_chain(group, act):
    mlp = _mlp(group, act=act)
    x = torch.randn(2, 5, mlp.in_type.dim, dtype=torch.float64, requires_grad=True)
    grads = {}
    for impl in (_schur_mlp, _rows_mlp, _lean_rows_mlp):
        mlp.zero_grad(set_to_none=True)
        x.grad = None
        out = impl(mlp, x)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads[impl] = [x.grad.clone()] + [p.grad.clone() for p in mlp.parameters()]
    for impl in (_rows_mlp, _lean_rows_mlp):
        for a, b in zip(grads[_schur_mlp], grads[impl]):
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    params = tuple(mlp.parameters())  # perturbed in place by gradcheck: the parameters' gradients too
    for impl in (_rows_mlp, _lean_rows_mlp):
        torch.autograd.gradcheck(lambda t, *_, f=impl: f(mlp, t), (x[:1, :2].detach().requires_grad_(), *params))


def test_lean_rows_mlp_keeps_one_hidden_tensor_for_backward():
    """The lean form saves the pre-activation values, where the chain saves them and the activated rows:
    one hidden-sized tensor fewer."""
    mlp = _mlp("D4", copies=4, hidden_copies=16).float()
    x = torch.randn(4, 50, mlp.in_type.dim, requires_grad=True)

    def saved_bytes(impl) -> int:
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            impl(mlp, x)
        storages.pop(x.untyped_storage().data_ptr(), None)
        return sum(storages.values())

    hidden = 4 * 50 * mlp.act.in_type.dim * 4
    chain, lean = saved_bytes(_rows_mlp), saved_bytes(_lean_rows_mlp)
    assert chain - lean >= 0.95 * hidden and lean < 1.6 * hidden


@pytest.mark.parametrize("impl", [_rows_mlp, _lean_rows_mlp], ids=["chain", "lean"])
def test_rows_mlp_under_autocast(impl):
    """bf16 autocast: float32 gradients close to float32's (the lean backward runs under the forward's
    autocast state)."""
    mlp = _mlp("D4").float()
    x = torch.randn(2, 5, mlp.in_type.dim, requires_grad=True)
    _schur_mlp(mlp, x).sum().backward()
    reference = [t.grad.clone() for t in (x, *mlp.parameters())]
    mlp.zero_grad(set_to_none=True)
    x.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = impl(mlp, x)
    out.float().sum().backward()
    assert x.grad.dtype == torch.float32 and all(p.grad.dtype == torch.float32 for p in mlp.parameters())
    for got, want in zip((x.grad, *(p.grad for p in mlp.parameters())), reference):
        assert (got - want).abs().max() <= 0.05 * want.abs().max()
    with torch.no_grad():
        assert (out.float() - _schur_mlp(mlp, x)).abs().max() <= 0.05 * out.float().abs().max()


def test_rows_mlp_costs_the_schur_minimum_and_two_transforms():
    mlp = _mlp("D4", copies=3, hidden_copies=5)
    T = 7
    x = torch.randn(T, mlp.in_type.dim, dtype=torch.float64)
    with torch.no_grad(), flop_counter(display=False) as counter:
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


@pytest.mark.parametrize("kind", ["identity", "gelu", "silu"])
def test_transformed_rows_in_is_rows_in_of_the_transform_with_its_gradients(kind):
    from eqvit.nn.rows_mlp import _ACTIVATIONS, transformed_rows_in

    V = FeatureType.regular(get_group("D4"), 4, layout="components")
    lin = randomise_(IrrepLinear(V, V)).double()
    n, s = 4, V.dim // 4
    transform = torch.randn(s, s, dtype=torch.float64)
    values = torch.randn(s, 6 * n, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, V.dim, dtype=torch.float64)

    def reference(v):
        rows = torch.mm(transform, _ACTIVATIONS[kind][0](v)).view(s, -1, n)
        return rows_in(rows, lin.plan, *lin.slab_weights())

    expected = reference(values)
    (expected * weight).sum().backward()
    grads = [t.grad.clone() for t in (values, *lin.parameters())]
    values.grad = None
    lin.zero_grad(set_to_none=True)
    got = transformed_rows_in(values, transform, lin, n, kind)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    (got * weight).sum().backward()
    for a, b in zip(grads, (values.grad, *(p.grad for p in lin.parameters()))):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


class _HandMadeLinear(nn.Module):
    """A Schur linear with a given plan (here: an input slab read by two outputs), for the Function's backward."""

    def __init__(self, plan, n: int) -> None:
        super().__init__()
        self.plan = plan
        self.mats = nn.ParameterList([torch.randn(w, plan.in_sizes[s], dtype=torch.float64) for s, w in plan.terms])
        self.biases = nn.ParameterList([torch.randn(w, dtype=torch.float64) for _, w in plan.terms])

    def slab_weights(self):
        return list(self.mats), list(self.biases)


@pytest.mark.parametrize("case", ["column_blocks", "unread_slab", "slab_read_twice"])
def test_transformed_rows_in_backward_in_blocks_and_in_place(case, monkeypatch):
    """The backward works a block of columns at a time and writes the rows' gradients into one buffer: blocks
    that do not divide the columns, rows no output reads (zero gradient), a slab read twice (accumulated)."""
    from eqvit.nn import rows_mlp
    from eqvit.nn.schur import SlabPlan

    n = 3
    if case == "column_blocks":
        monkeypatch.setattr(rows_mlp, "_BLOCK_COLUMNS", 5)  # 7 tokens x 3 = 21 columns: blocks of 5, the last 1
        lin = randomise_(IrrepLinear(*(FeatureType.regular(get_group("D4"), n, layout="components"),) * 2)).double()
    elif case == "unread_slab":  # the output lacks irreps the input has: their rows get no gradient
        G = get_group("D4")
        src = FeatureType(G, [n] * len(G.irreps), layout="components")
        dst = FeatureType(G, [n * (i % 2) for i in range(len(G.irreps))], layout="components")
        lin = randomise_(IrrepLinear(src, dst)).double()
    else:
        lin = _HandMadeLinear(SlabPlan((2 * n, n), ((0, 4), (0, 2), (1, 5))), n)
    s = sum(lin.plan.in_sizes) // n
    transform = torch.randn(s, s, dtype=torch.float64)
    values = torch.randn(s, 7 * n, dtype=torch.float64, requires_grad=True)

    def reference(v):
        rows = torch.mm(transform, rows_mlp._ACTIVATIONS["gelu"][0](v)).view(s, -1, n)
        return rows_in(rows, lin.plan, *lin.slab_weights())

    weight = torch.randn_like(reference(values))
    grads = torch.autograd.grad((reference(values) * weight).sum(), [values, *lin.parameters()])
    got = rows_mlp.transformed_rows_in(values, transform, lin, n, "gelu")
    got_grads = torch.autograd.grad((got * weight).sum(), [values, *lin.parameters()])
    for a, b in zip(grads, got_grads):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("block", [1, 2, 3], ids=lambda k: f"block{k}")
def test_lean_rows_mlp_in_coordinate_blocks(block, monkeypatch):
    """The lean MLP streams its hidden rows a block of coordinates at a time: blocks that divide the row width
    and blocks that do not (the last one shorter) give the chain's output and gradients."""
    from eqvit.nn import rows_mlp

    monkeypatch.setattr(rows_mlp, "_BLOCK_COORDINATES", block)
    mlp = _mlp("D4", copies=2, hidden_copies=5)  # rows of 5 coordinates
    x = torch.randn(2, 3, mlp.in_type.dim, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 3, mlp.in_type.dim, dtype=torch.float64)
    results = []
    for impl in (_schur_mlp, _lean_rows_mlp):
        out = impl(mlp, x)
        results.append([out, *torch.autograd.grad((out * weight).sum(), [x, *mlp.parameters()])])
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def _assert_one_graph_matches(f, reference, x: torch.Tensor, params) -> None:
    """``torch.compile(f, fullgraph=True)`` gives ``reference``'s output and gradients (x and ``params``)."""
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *params])
    want = reference(x)
    want_grads = torch.autograd.grad(want.square().sum(), [x, *params])
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for got, ref in zip(grads, want_grads):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_lean_rows_mlp_compiles_as_one_graph_with_several_blocks(monkeypatch):
    """torch.compile(fullgraph=True) traces the lean MLP's forward and backward when the hidden rows come in
    several blocks (strided ``out=`` tensors would break the graph; the tiny registered models fit one block)."""
    from eqvit.nn import rows_mlp

    monkeypatch.setattr(rows_mlp, "_BLOCK_COORDINATES", 2)
    torch._dynamo.reset()
    mlp = _mlp("D4", copies=2, hidden_copies=5).float()
    x = torch.randn(2, 3, mlp.in_type.dim, requires_grad=True)
    _assert_one_graph_matches(mlp, lambda v: _schur_mlp(mlp, v), x, list(mlp.parameters()))


def test_transformed_rows_in_compiles_as_one_graph_with_several_blocks(monkeypatch):
    """The same for :func:`transformed_rows_in` (the Fourier Platonic attention's projection), whose backward
    works in blocks of columns."""
    from eqvit.nn import rows_mlp

    monkeypatch.setattr(rows_mlp, "_BLOCK_COLUMNS", 5)
    torch._dynamo.reset()
    V = FeatureType.regular(get_group("D4"), 3, layout="components")
    lin = randomise_(IrrepLinear(V, V))
    n, s = 3, V.dim // 3
    transform = torch.randn(s, s)
    values = torch.randn(s, 7 * n, requires_grad=True)

    def f(v):
        return rows_mlp.transformed_rows_in(v, transform, lin, n, "gelu")

    _assert_one_graph_matches(f, f, values, list(lin.parameters()))
