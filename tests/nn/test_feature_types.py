"""Feature types: both bases, the Fourier change between them, and layers checked through their types."""

import numpy as np
import pytest
import torch
from helpers import randomise_

from eqvit.groups import get_group
from eqvit.nn.activation import FourierActivation, homogeneous_fourier_basis
from eqvit.nn.irrep_attention import IrrepAttention, coupled_heads, irrepwise_heads
from eqvit.nn.irrep_blocks import IrrepMlp, irrep_block
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.platonic import PlatonicAttention, PlatonicMlp, platonic_block
from eqvit.nn.regular import GroupConvLinear, frame_action
from eqvit.testing import EquivarianceError, assert_equivariant

GROUPS = ["C1", "D1", "C4", "D4", "C6", "D6", "T", "O", "I"]


@pytest.mark.parametrize("name", GROUPS)
def test_frame_basis_fourier_is_orthogonal_and_intertwines(name):
    G = get_group(name)
    frames = FeatureType.frames(G, 2)
    irreps = frames.in_irrep_basis()
    assert irreps == FeatureType.regular(G, 2) and frames != irreps and frames.in_frame_basis() is frames
    Q = frames.fourier
    np.testing.assert_allclose(Q.T @ Q, np.eye(frames.dim), atol=1e-12)
    x = torch.randn(3, frames.dim, dtype=torch.float64)
    for g in range(G.order):
        # act_frames(g, x) F == act_irrep(g, x F), on matrices and on tensors
        np.testing.assert_allclose(frames.representation[g] @ Q, Q @ irreps.representation[g], atol=1e-12)
        torch.testing.assert_close(frames.to_irrep_basis(frames.act(g, x)), irreps.act(g, frames.to_irrep_basis(x)))
        torch.testing.assert_close(frames.act(g, x), frame_action(G, g, x), rtol=0, atol=0)
    torch.testing.assert_close(frames.from_irrep_basis(frames.to_irrep_basis(x)), x)


@pytest.mark.parametrize("name", ["D4", "C6", "O"])
@pytest.mark.parametrize("basis", ["irrep", "frames"])
def test_representation_is_a_homomorphism(name, basis):
    G = get_group(name)
    ftype = FeatureType.frames(G, 2) if basis == "frames" else FeatureType.regular(G, 2)
    rep = ftype.representation
    np.testing.assert_allclose(rep[0], np.eye(ftype.dim), atol=1e-12)
    i, j = np.meshgrid(np.arange(G.order), np.arange(G.order), indexing="ij")
    np.testing.assert_allclose(rep[i] @ rep[j], rep[G.cayley[i, j]], atol=1e-12)
    x = torch.randn(2, ftype.dim, dtype=torch.float64)
    for g in range(G.order):
        torch.testing.assert_close(ftype.act(g, x), x @ torch.tensor(rep[g]).T)


def test_frame_basis_needs_regular_multiples():
    G = get_group("D4")
    with pytest.raises(ValueError, match="multiples of the regular representation"):
        FeatureType(G, {"A1": 1}, basis="frames")
    with pytest.raises(ValueError, match="unknown basis"):
        FeatureType(G, {"A1": 1}, basis="fourier")
    with pytest.raises(ValueError, match="frame basis"):
        FeatureType.regular(G, 2).channels  # noqa: B018


@pytest.mark.parametrize("name", ["C4", "D4", "D6", "T", "O"])
def test_group_convolution_is_the_schur_linear_in_the_fourier_basis(name):
    """y_f = x_f W^T on frames; in the irrep basis (x_i = x_f Q) that is x_i (Q^T W^T Q), and
    ``load_dense_`` accepts Q^T W Q only if it commutes with the irrep action (it raises otherwise)."""
    G = get_group(name)
    conv = randomise_(GroupConvLinear(G, 3, 2, impl="cayley")).double()
    irrep_linear = IrrepLinear(conv.in_type.in_irrep_basis(), conv.out_type.in_irrep_basis(), bias=True).double()
    Q_in = torch.from_numpy(np.array(conv.in_type.fourier))
    Q_out = torch.from_numpy(np.array(conv.out_type.fourier))
    W, b = conv.dense_weight_and_bias()
    irrep_linear.load_dense_(Q_out.T @ W.detach() @ Q_in, b.detach() @ Q_out, atol=1e-10)
    x = torch.randn(4, conv.in_type.dim, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(irrep_linear(conv.in_type.to_irrep_basis(x)), conv.out_type.to_irrep_basis(conv(x)))
    # The irrep-wise form has exactly the group convolution's parameters (|G| C_out C_in, bias C_out).
    assert sum(p.numel() for p in irrep_linear.parameters()) == sum(p.numel() for p in conv.parameters())


def _layers():
    D4, O = get_group("D4"), get_group("O")
    V = FeatureType.regular(D4, 2)
    hidden, basis, _ = homogeneous_fourier_basis(D4, [("regular", 2), ("trivial", 1)])
    yield "IrrepLinear", IrrepLinear(V, FeatureType(D4, {"A1": 1, "E1": 3}))
    yield "IrrepLayerNorm", IrrepLayerNorm(V)
    yield "IrrepAttention coupled", IrrepAttention(V, coupled_heads(V, 2))
    yield "IrrepAttention irrepwise", IrrepAttention(V, irrepwise_heads(V, 1))
    yield "FourierActivation", FourierActivation(hidden, basis)
    yield "IrrepMlp", IrrepMlp(V, FourierActivation(hidden, basis))
    yield "irrep_block", irrep_block(V, coupled_heads(V, 2), FourierActivation(hidden, basis))
    yield "GroupConvLinear cayley", GroupConvLinear(O, 3, 2, impl="cayley")
    yield "GroupConvLinear fourier", GroupConvLinear(O, 3, 2, impl="fourier")
    yield "PlatonicAttention", PlatonicAttention(O, 4, 2)
    yield "PlatonicAttention invariant", PlatonicAttention(O, 4, 2, scores="invariant")
    yield "PlatonicMlp", PlatonicMlp(O, 4, 8)
    yield "platonic_block", platonic_block(O, 4, 2, init_values=0.5)


LAYERS = dict(_layers())


@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_are_checked_through_their_types(name):
    layer = randomise_(LAYERS[name])
    report = assert_equivariant(layer)  # actions and input read from in_type / out_type
    assert report.group == layer.in_type.group.name and len(report.rows) == layer.in_type.group.order


def test_a_broken_layer_fails_its_type_check():
    O = get_group("O")
    conv = randomise_(GroupConvLinear(O, 3, 2, impl="cayley"))
    conv.kernel_index = conv.kernel_index.roll(1, dims=1)  # a wrong Cayley gather
    with pytest.raises(EquivarianceError, match="NOT equivariant under O"):
        assert_equivariant(conv)
    norm = randomise_(IrrepLayerNorm(FeatureType.regular(get_group("D4"), 2)))
    # Declaring a type the layer does not have fails too: the norm is not equivariant on frames.
    norm.out_type = norm.in_type = FeatureType.frames(get_group("D4"), 2)
    with pytest.raises(EquivarianceError):
        assert_equivariant(norm)


@pytest.mark.parametrize("name", ["o2vit_square_tiny", "platonic_points_tiny"])
def test_geometry_buffers_changed_in_place_are_seen_by_the_check(name):
    """The float64 copy of the check must not restore an edited geometry buffer from its float64
    master: a model whose filter basis (or frames) was changed in place is reported as broken."""
    import eqvit
    from eqvit.nn.buffers import ExactBuffers

    model = randomise_(eqvit.create_model(name)).eval()
    assert_equivariant(model)
    target = next(m for m in model.modules() if isinstance(m, ExactBuffers) and m._exact_masters)
    buffer = getattr(target, next(iter(target._exact_masters)))
    with torch.no_grad():
        buffer.copy_(buffer.flip(0) + 0.5 * torch.randn_like(buffer))
    with pytest.raises(EquivarianceError, match="NOT equivariant"):
        assert_equivariant(model)
