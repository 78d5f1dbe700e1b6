"""O(2)-subgroup ViTs (O(2) seed): every layer and the whole model, for the D4 and D6 families.

Group actions are derived here from geometry, never from the model: an element g (a 2x2 matrix of
the group core) permutes the pixel centres ``model.domain.points`` (``point_permutation``), and an
image transforms as ``(g . I)(p) = I(g^-1 p)``, i.e. the value at point i moves to point
``perm[i]`` with ``points[perm[i]] = g points[i]``. Token features transform with the group
core's irrep matrices (``FeatureType.representation`` = blockdiag of ``I_C (x) rho(g)``).
"""

from __future__ import annotations

import copy
from functools import partial

import helpers
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import eqvit
from eqvit.geometry import HexPatchGrid, point_permutation, square_grid
from eqvit.geometry.points import permutations_for
from eqvit.groups import get_group
from eqvit.nn.activation import FourierActivation, homogeneous_fourier_basis
from eqvit.nn.irrep_attention import IrrepAttention, coupled_heads, irrepwise_heads
from eqvit.nn.irrep_blocks import TokenInvariants
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Mlp
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.posenc.invariant import InvariantAPE
from eqvit.nn.tokenizers.hexagonal import HEX_GROUPS, HexPatchTokenizer, SquareToHex
from eqvit.nn.tokenizers.planar import patch_filter_basis
from eqvit.nn.tokenizers.square import SQUARE_GROUPS, SquarePatchTokenizer
from eqvit.testing import EquivarianceError, assert_equivariant

# Layer-level checks use a fixed noise scale (0.5 unless a test says otherwise).
randomise_ = partial(helpers.randomise_, scale=0.5)

TOL = 1e-9
FAMILY = [("square", g) for g in SQUARE_GROUPS] + [("hex", g) for g in HEX_GROUPS]
ALL_O2_GROUPS = sorted(set(SQUARE_GROUPS) | set(HEX_GROUPS))


def act_on_field(points: np.ndarray, g: np.ndarray, x: torch.Tensor, spatial: int) -> torch.Tensor:
    """``(g . x)(p) = x(g^-1 p)`` for ``x [..., *spatial]`` over ``points`` (row-major)."""
    perm = torch.as_tensor(point_permutation(points, g))
    flat = x.flatten(x.ndim - spatial)
    out = torch.empty_like(flat)
    out[..., perm] = flat
    return out.reshape(x.shape)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def tiny(grid: str, group: str, attention: str = "coupled", **kw) -> nn.Module:
    """The tiny model of ``grid``; the hexagonal one on its own grid (``img_size=None``: input ``[B, C, P]``,
    equivariant to all of ``group``)."""
    torch.manual_seed(0)
    name = "o2vit_square_tiny" if grid == "square" else "o2vit_hex_tiny"
    if grid == "hex":
        kw = dict(dict(img_size=None), **kw)
    return eqvit.create_model(name, group=group, attention=attention, **kw)


# ------------------------------------------------------------------------------------------------
# whole model: invariant logits for every group of both families and both attention layouts


@pytest.mark.parametrize("attention", ["coupled", "irrepwise"])
@pytest.mark.parametrize(("grid", "group"), FAMILY, ids=[f"{a}-{b}" for a, b in FAMILY])
def test_logits_invariant(grid, group, attention):
    model = randomise_(tiny(grid, group, attention)).double().eval()
    G = get_group(group)
    assert model.group is G
    points = model.domain.points
    if grid == "square":
        assert np.array_equal(points, square_grid(8, 8))
    else:
        assert np.array_equal(points, HexPatchGrid(2, 4).points)
    spatial = len(model.domain.shape)
    x = torch.randn(2, 3, *model.domain.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        y = model(x)
        assert y.shape == (2, 5) and y.abs().max() > 1e-2
        errors = [rel_err(model(act_on_field(points, g, x, spatial)), y) for g in G.elements]
    assert max(errors) <= TOL, errors
    # ... and the model is not trivially invariant: other rotations change the logits.
    if grid == "hex" or G.order < 8:
        return
    with torch.no_grad():
        x_t = x.transpose(-1, -2).flip(-1)  # a D4 element, sanity: must agree (already covered)
        assert rel_err(model(x_t), y) <= TOL


def test_model_sees_non_symmetric_inputs():
    """C4 logits change under a reflection (not in C4): the model is not more invariant than declared."""
    model = randomise_(tiny("square", "C4")).double().eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    t = np.diag([1.0, -1.0])
    with torch.no_grad():
        assert rel_err(model(act_on_field(model.domain.points, t, x, 2)), model(x)) > 1e-3


# ------------------------------------------------------------------------------------------------
# layers on random irrep features against the group core's representation matrices


def _types(G):
    regular = FeatureType.regular(G, 2)
    odd = FeatureType(G, [k % 3 + 1 for k in range(len(G.irreps))])  # arbitrary multiplicities
    return regular, odd


@pytest.mark.parametrize("name", ALL_O2_GROUPS)
def test_feature_type_representation(name):
    G = get_group(name)
    V = FeatureType.regular(G, 3)
    assert V.dim == 3 * G.order
    R = V.representation
    assert np.allclose(np.einsum("gab,gcb->gac", R, R), np.eye(V.dim), atol=1e-12)
    assert np.allclose(np.einsum("gab,hbc->ghac", R, R), R[G.cayley], atol=1e-12)  # homomorphism
    for rho, c in zip(V.irreps, V.multiplicities):  # C copies of the regular rep (eq. 2, Sec. 4)
        assert c == 3 * rho.dim // (2 if rho.type == "complex" else 1)


@pytest.mark.parametrize("name", ALL_O2_GROUPS)
def test_irrep_linear_equivariant_and_complete(name):
    G = get_group(name)
    V, W = _types(G)
    lin = randomise_(IrrepLinear(V, W)).double()
    A = lin.weight_matrix().detach().numpy()
    assert (
        np.abs(np.einsum("ab,gbc->gac", A, V.representation) - np.einsum("gab,bc->gac", W.representation, A)).max()
        < 1e-12
    )
    # The bias lives on the trivial irrep only, so the affine map is equivariant too (eq. 5).
    x = torch.randn(4, V.dim, dtype=torch.float64)
    y = lin(x)
    for g in range(G.order):
        assert rel_err(lin(V.act(g, x)), W.act(g, y)) < TOL
    # Eq. 4 exhausts Hom_G(V, W): the number of parameters equals its dimension (Schur).
    n_params = sum(w.numel() for w in lin.weight_blocks())
    constraint = np.concatenate(
        [
            np.kron(W.representation[g], np.eye(V.dim)) - np.kron(np.eye(W.dim), V.representation[g].T)
            for g in range(G.order)
        ]
    )
    assert n_params == V.dim * W.dim - np.linalg.matrix_rank(constraint)
    assert sum(1 for rho in G.irreps if rho.type == "complex") == sum(1 for w in lin.weight_blocks() if w.shape[0] == 2)


@pytest.mark.parametrize("name", ALL_O2_GROUPS)
def test_layer_norm_equivariant(name):
    G = get_group(name)
    _, V = _types(G)
    norm = randomise_(IrrepLayerNorm(V)).double()
    x = torch.randn(4, V.dim, dtype=torch.float64) + 0.3
    y = norm(x)
    assert all(rel_err(norm(V.act(g, x)), V.act(g, y)) < TOL for g in range(G.order))


@pytest.mark.parametrize("name", ["D4", "D6", "C6", "D3"])
def test_fourier_activation_equivariant_for_every_homogeneous_space(name):
    G = get_group(name)
    spaces = [(H, k + 1) for k, H in enumerate(G.subgroups())]
    ftype, basis, perms = homogeneous_fourier_basis(G, spaces)
    # P(g) basis = basis rho(g): inverse FT intertwines the permutation and the irrep actions (eq. 9).
    P = np.zeros((G.order, len(basis), len(basis)))
    for g in range(G.order):
        P[g, perms[g], np.arange(len(basis))] = 1.0
    assert np.allclose(basis.T @ basis, np.eye(ftype.dim), atol=1e-12)
    assert np.abs(P @ basis - basis @ ftype.representation).max() < 1e-12
    # C'_rho = sum_alpha Gamma^alpha_rho n_alpha (eq. 11 and Tables 2-3).
    expected = {rho.name: 0 for rho in G.irreps}
    for H, n in spaces:
        for k, v in G.homogeneous_space(H).multiplicities.items():
            expected[k] += n * v
    assert dict(zip([r.name for r in G.irreps], ftype.multiplicities)) == expected
    act = FourierActivation(ftype, basis).double()
    x = torch.randn(4, ftype.dim, dtype=torch.float64)
    y = act(x)
    assert all(rel_err(act(ftype.act(g, x)), ftype.act(g, y)) < TOL for g in range(G.order))


def test_fourier_activation_d3_example_of_the_seed():
    """D3/{e} + 2 x D3/<t>: A1 x 3, A2 x 1, E1 x 4 (regular = A1 + A2 + 2 E1, triangle = A1 + E1)."""
    G = get_group("D3")
    t = next(H for H in G.subgroups() if len(H) == 2)
    ftype, _, _ = homogeneous_fourier_basis(G, [("regular", 1), (t, 2)])
    assert ftype.multiplicities == [3, 1, 4]


@pytest.mark.parametrize("layout", ["copies", "components"])
@pytest.mark.parametrize(("grid", "group"), [("square", "D4"), ("square", "C4"), ("hex", "D6"), ("hex", "C3")])
def test_patch_embedding_and_ape_equivariant(grid, group, layout):
    """Tokens of g . I are the tokens of I moved to g . a and acted on by rho_V(g) (eq. 6-8)."""
    G = get_group(group)
    V = FeatureType.regular(G, 2, layout=layout)
    if grid == "square":
        tok = SquarePatchTokenizer(G, 12, 4, 2, V)
        points, shape = square_grid(12, 12), (12, 12)
    else:
        hexgrid = HexPatchGrid(2, 3)
        tok = HexPatchTokenizer(G, hexgrid, 2, V)
        points, shape = hexgrid.points, (hexgrid.num_points,)
    tok = randomise_(tok).double()
    ape = randomise_(InvariantAPE(G, tok.centers, V)).double()
    x = torch.randn(2, 2, *shape, dtype=torch.float64)
    with torch.no_grad():
        y = ape.add_to_tokens(tok(x)[:, 1:])
        cls = tok(x)[:, 0]
        for g in range(G.order):
            token_perm = torch.as_tensor(point_permutation(tok.centers, G.elements[g]))
            expected = torch.empty_like(y)
            expected[:, token_perm] = V.act(g, y)
            got_all = tok(act_on_field(points, G.elements[g], x, len(shape)))
            assert rel_err(ape.add_to_tokens(got_all[:, 1:]), expected) < TOL
            assert torch.equal(got_all[:, 0], cls)  # the class token is the trivial ★
        # The encoding itself is invariant: rho(g) p(g^-1 a) = p(a).
        p = ape.embedding()
        for g in range(G.order):
            perm = torch.as_tensor(point_permutation(tok.centers, G.elements[g]))
            moved = torch.empty_like(p)
            moved[perm] = V.act(g, p)
            assert rel_err(moved, p) < TOL
    # The class token is zero outside the trivial irrep.
    nontrivial = np.setdiff1d(np.arange(V.dim), V.trivial_index)
    assert cls[:, nontrivial].abs().max() == 0 and cls[:, V.trivial_index].abs().max() > 0


def test_patch_filter_basis_multiplicities_hexagon():
    """C(U) of a 19-pixel hexagon under D6: the filter basis is orthonormal, multiplicities by characters."""
    G = get_group("D6")
    tok = HexPatchTokenizer(G, HexPatchGrid(1, 3), 1, FeatureType.regular(G, 1)).double()
    B = tok.embed.filter_basis.numpy()
    assert np.allclose(B @ B.T, np.eye(19), atol=1e-12)
    perms = permutations_for(tok.offsets, G.elements)
    chi = (perms == np.arange(19)).sum(1).astype(float)  # character of the permutation rep
    for rho, c in zip(tok.embed.in_type.irreps, tok.embed.in_type.multiplicities):
        assert c == round(float(chi @ rho.character) / G.order)


@pytest.mark.parametrize("group", ["D4", "C4", "D6"])
def test_patch_filter_basis_in_the_components_layout(group):
    """The basis in ``components`` is the ``copies`` one with its rows in that layout's order, and intertwines."""
    G = get_group(group)
    V = FeatureType.regular(G, 1)
    tok = HexPatchTokenizer(G, HexPatchGrid(1, 3), 2, V) if group == "D6" else SquarePatchTokenizer(G, 8, 4, 2, V)
    offsets = tok.offsets
    copies, B = patch_filter_basis(G, offsets, 2)
    components, B_comp = patch_filter_basis(G, offsets, 2, "components")
    assert components == copies.with_layout("components")
    for i, *_ in copies.blocks():
        np.testing.assert_array_equal(B_comp[components.block_coords(i)], B[copies.block_coords(i)])
    perms = permutations_for(offsets, G.elements)
    for g in range(G.order):
        P = np.kron(np.eye(2), np.eye(len(offsets))[perms[g]].T)  # P_U(g) on channel-major patches
        np.testing.assert_allclose(B_comp @ P, components.representation[g] @ B_comp, atol=1e-12)


@pytest.mark.parametrize("group", ["D4", "C4"])
def test_schur_patch_embedding_builds_its_filters_slab_by_slab(group):
    """Tokens in ``components``: the embedding's filters W E are the block-wise reference, built by one product per
    slab, the Schur minimum of multiply-adds and no dense W (its gradients too)."""
    G = get_group(group)
    tok = randomise_(SquarePatchTokenizer(G, 8, 4, 3, FeatureType.regular(G, 2, layout="components"))).double()
    embed = tok.embed
    assert embed.proj.schur and embed.in_type.layout == "components"
    filters, bias = embed.dense()
    torch.testing.assert_close(filters, embed.filters_reference(), rtol=0, atol=1e-12)
    torch.testing.assert_close(bias, embed.proj.bias_vector())
    with eqvit.utils.flop_counter(display=False) as counter:
        embed.dense()
    k = embed.filter_basis.shape[1]
    schur = sum(w * embed.proj.plan.in_sizes[s] for s, w in embed.proj.plan.terms if s >= 0)
    products = counter.get_flop_counts()["Global"][torch.ops.aten.mm]  # the rest builds a complex irrep's L (x) w
    assert products == 2 * schur * k < 2 * embed.proj.out_type.dim * embed.in_type.dim * k
    weight = torch.randn_like(filters)
    (filters * weight).sum().backward()
    reference = copy.deepcopy(embed)
    reference.proj.weight.grad = None
    (reference.filters_reference() * weight).sum().backward()
    torch.testing.assert_close(embed.proj.weight.grad, reference.proj.weight.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", ["copies", "components"])
def test_irrep_linear_matmul_is_the_dense_product(layout):
    G = get_group("C4")  # a complex-type irrep: its slab is a whole [d C'', d C'] block
    lin = randomise_(IrrepLinear(FeatureType.regular(G, 3, layout), FeatureType.regular(G, 2, layout))).double()
    other = torch.randn(lin.in_type.dim, 5, dtype=torch.float64)
    torch.testing.assert_close(lin.matmul(other), lin.weight_matrix() @ other, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["coupled", "irrepwise"])
@pytest.mark.parametrize("name", ["D4", "C4", "D6", "C3"])
def test_attention_equivariant(name, layout):
    G = get_group(name)
    V = FeatureType.regular(G, 3)
    heads = coupled_heads(V, 3) if layout == "coupled" else irrepwise_heads(V, 3)
    attn = randomise_(IrrepAttention(V, heads)).double().eval()
    x = torch.randn(2, 5, V.dim, dtype=torch.float64)
    y = attn(x)
    assert all(rel_err(attn(V.act(g, x)), V.act(g, y)) < TOL for g in range(G.order))
    perm = torch.randperm(5)
    assert rel_err(attn(x[:, perm]), y[:, perm]) < TOL  # token permutations
    reference = copy.deepcopy(attn)
    reference.sdpa.fused = False
    torch.testing.assert_close(reference(x), y, rtol=1e-10, atol=1e-12)
    if layout == "coupled":  # each head holds C/h copies of every irrep
        assert len(heads) == 3 and all(len(h) == V.dim // 3 for h in heads)
    else:  # each head holds one irrep only
        assert len(heads) == 3 * len(G.irreps)
        assert all(len({V.copies[c][0] for c in V.copy_index[h]}) == 1 for h in heads)


@pytest.mark.parametrize("name", ["D4", "C6"])
def test_token_invariants(name):
    G = get_group(name)
    V = FeatureType.regular(G, 2)
    readout = TokenInvariants(V)
    tokens = torch.randn(3, 2, V.dim, dtype=torch.float64)
    assert readout.num_features == len(V.copies)  # trivial channels + one norm per non-trivial copy
    y = readout(tokens)
    assert y.shape == (3, 2, len(V.copies))
    assert all(rel_err(readout(V.act(g, tokens)), y) < TOL for g in range(G.order))
    # the trivial coordinates come first, then one norm per non-trivial irrep copy
    torch.testing.assert_close(y[..., : len(V.trivial_index)], tokens[..., V.trivial_index])


# ------------------------------------------------------------------------------------------------
# restriction (Theorem 2): an H-equivariant model of the same family computing the same function

RESTRICTIONS = [("square", "coupled", H) for H in ["C4", "D2", "C2", "D1", "C1", "D2[45deg]"]]
RESTRICTIONS += [("hex", "coupled", H) for H in ["C6", "D3", "C3", "D2", "C2", "D1", "C1", "D3[30deg]"]]
RESTRICTIONS += [("square", "irrepwise", "C4"), ("square", "irrepwise", "D1"), ("hex", "irrepwise", "D3")]
RESTRICTIONS += [("hex", "irrepwise", "C2")]


@pytest.mark.parametrize(("grid", "attention", "sub"), RESTRICTIONS, ids=["-".join(r) for r in RESTRICTIONS])
def test_restricted_token_type_is_the_restricted_representation(grid, attention, sub):
    """The restricted model's token type has H's multiplicities D_sigma of V restricted to H (the group core's
    Res, Theorem 2), and G's coupled heads map onto H's coupled heads (Phi of App. E). That it computes the
    same function is tests/models/test_restriction.py's test."""
    from eqvit.groups import Representation

    model = tiny(grid, "D4" if grid == "square" else "D6", attention)
    restricted = eqvit.restrict(model, sub)
    assert type(restricted.tokenizer) is type(model.tokenizer)
    W, G, H = restricted.token_type, model.group, restricted.group
    expected = {k: 0 for k in (s.name for s in H.irreps)}
    for rho, c in zip(model.token_type.irreps, model.token_type.multiplicities, strict=True):
        for k, n in Representation(G, [rho]).restrict(H).multiplicities.items():
            expected[k] += c * n
    assert dict(zip([s.name for s in H.irreps], W.multiplicities, strict=True)) == expected
    if attention == "coupled":
        assert [sorted(h) for h in restricted.blocks[0].attn.heads] == [list(h) for h in coupled_heads(W, 3)]


def test_restriction_chains_and_keeps_dtype():
    model = randomise_(tiny("square", "D4")).eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    d2 = eqvit.restrict(model, "D2")
    c2 = eqvit.restrict(d2, "C2")
    assert next(c2.parameters()).dtype == torch.float32 and c2.group.name == "C2" and not c2.training
    with torch.no_grad():
        torch.testing.assert_close(c2(x), model(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="subgroup of D4"):
        eqvit.restrict(model, "C3")


# ------------------------------------------------------------------------------------------------
# a deliberately broken layer is caught


@pytest.mark.parametrize("where", ["mlp", "patch_embed"])
def test_broken_layer_fails(where):
    model = randomise_(tiny("square", "D4"))
    dim = model.embed_dim
    if where == "mlp":
        model.blocks[0].mlp = Mlp(dim, 2 * dim)  # unconstrained nn.Linear layers: not equivariant
    else:
        model.tokenizer.embed.filter_basis = torch.randn_like(model.tokenizer.embed.filter_basis)
    with pytest.raises(EquivarianceError) as info:
        assert_equivariant(model, batch_size=1)
    assert info.value.report.rows[0][2] == 0.0  # the identity is fine, other elements are not


# ------------------------------------------------------------------------------------------------
# configuration, errors


def test_registry_and_kwargs():
    names = eqvit.list_models("o2vit*")
    assert {"o2vit_square_tiny", "o2vit_hex_tiny", "o2vit_square_s", "o2vit_hex_s"} <= set(names)
    m = tiny("square", "D2", attention="irrepwise", in_chans=1, num_classes=7)
    assert m.group.name == "D2" and m.in_chans == 1 and m.out_chans == 7
    assert m.config["attention"] == "irrepwise" and m.embed_dim == 3 * 4
    assert m(torch.randn(2, 1, 8, 8)).shape == (2, 7)
    m = eqvit.create_model("o2vit_square_tiny", embed_dim=16, num_heads=2)  # 2 regular copies of D4
    assert m.token_type == FeatureType.regular(get_group("D4"), 2)


def test_seed_configurations():
    """App. F: square 256^2 with 16^2 patches (256 tokens); hexagonal 217 patches x 217 pixels."""
    sq = eqvit.create_model("o2vit_square_s")
    assert sq.domain.shape == (256, 256) and sq.tokenizer.num_tokens == 256 and len(sq.blocks) == 6
    assert sq.group.name == "D4" and len(sq.blocks[0].attn.heads) == 3
    hx = eqvit.create_model("o2vit_hex_s", img_size=None)
    assert hx.domain.shape == (42073,) and hx.tokenizer.num_tokens == 217 and hx.tokenizer.offsets.shape == (217, 2)
    assert hx.group.name == "D6" and len(hx.blocks) == 6


def test_hexagonal_model_on_square_images():
    """By default a hexagonal model takes square images and resamples them onto its grid as its first layer:
    the same function as resampling first and calling the model built on the grid (img_size=None), exactly
    equivariant to the elements of D6 that map the image onto itself (the half turn and the axis reflections)."""
    on_images = randomise_(eqvit.create_model("o2vit_hex_tiny")).double().eval()
    on_grid = eqvit.create_model("o2vit_hex_tiny", img_size=None).double().eval()
    on_grid.load_state_dict(on_images.state_dict())
    assert on_images.domain.shape == (16, 16) and on_images.token_type.group.name == "D6"
    assert on_images.group.name == "D2" and on_images.group.parent is on_images.token_type.group
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(on_images(x), on_grid(SquareToHex(16, on_grid.domain.points).double()(x)))
    report = assert_equivariant(on_images)
    assert report.passed and len(report.rows) == 4
    with pytest.raises(ValueError, match=r"expected input of shape \[B, 3, 16, 16\]"):
        on_images(torch.randn(2, 3, len(on_grid.domain.points)))


def test_hexagonal_maps_in_axial_coordinates():
    """Intermediate maps of a hexagonal model: [B, C, 2r + 1, 2r + 1] with the patch centres in axial coordinates
    (the cells outside the hexagon zero), equivariant under intermediate_action for the model's group."""
    model = randomise_(tiny("hex", "D6")).double().eval()
    x = torch.randn(2, 3, len(model.domain.points), dtype=torch.float64)
    with torch.no_grad():
        _, maps = model.forward_intermediates(x)
        tokens = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
    assert all(m.shape == (2, model.embed_dim, 3, 3) for m in maps) and len(maps) == len(model.blocks)
    empty = np.setdiff1d(np.arange(9), model.token_grid.cells)
    assert len(empty) == 2 and not maps[-1].flatten(2)[..., empty].any()
    torch.testing.assert_close(model.token_grid.from_map(maps[-1]), tokens[-1].transpose(1, 2))
    for matrix in model.group.elements:
        with torch.no_grad():
            _, moved = model.forward_intermediates(model.domain.act(matrix, x))
        torch.testing.assert_close(moved[-1], model.intermediate_action(matrix, maps[-1]), rtol=1e-9, atol=1e-9)


def test_errors_name_what_was_expected():
    model = tiny("hex", "D6")
    with pytest.raises(ValueError, match=r"expected input of shape \[B, 3, 217\].*got \[2, 3, 30\]"):
        model(torch.randn(2, 3, 30))
    with pytest.raises(ValueError, match="D6"):
        tiny("square", "D6")  # the square grid is not D6-stable
    with pytest.raises(ValueError, match="multiple of"):
        eqvit.create_model("o2vit_square_tiny", embed_dim=20)
    with pytest.raises(ValueError, match="coupled"):
        eqvit.create_model("o2vit_square_tiny", regular_copies=2, num_heads=3)
    with pytest.raises(ValueError, match=r"irrepwise|coupled"):
        eqvit.create_model("o2vit_square_tiny", attention="global")


# ------------------------------------------------------------------------------------------------
# gradual symmetry breaking during training


def test_training_relaxes_to_a_subgroup_at_the_chosen_epoch():
    from eqvit.models.restrict import SymmetryRelaxation
    from eqvit.train.classify import fit_classifier

    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(24, 3, 8, 8, generator=gen), torch.randint(0, 5, (24,), generator=gen)
    model = tiny("square", "D4", drop_path_rate=0.0, attn_drop_rate=0.0, head_drop_rate=0.0)
    model, history = fit_classifier(
        model, (x, y), (x[:8], y[:8]), epochs=3, batch_size=8, relaxation=SymmetryRelaxation({1: "D2", 2: "C1"})
    )
    assert history.group == ["D4", "D2", "C1"] and len(history.train_loss) == 3
    assert model.group.name == "C1" and all(np.isfinite(history.train_loss))
    with pytest.raises(ValueError, match="non-negative"):
        SymmetryRelaxation({-1: "C4"})


def test_fast_paths_match_dense_references():
    """Block-wise linear, orbit-wise Fourier activation and the permuted MLP equal their dense forms."""
    G = get_group("D6")
    V = FeatureType.regular(G, 2)
    lin = randomise_(IrrepLinear(V, FeatureType(G, [1, 0, 2, 1, 3, 2]))).double()
    x = torch.randn(3, V.dim, dtype=torch.float64)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight_matrix(), lin.bias_vector()), rtol=0, atol=1e-12)
    act = FourierActivation.from_spaces(G, [("regular", 2)] + [(H, 1) for H in G.subgroups()]).double()
    h = torch.randn(3, act.in_type.dim, dtype=torch.float64)
    torch.testing.assert_close(act(h), act.forward_dense(h), rtol=0, atol=1e-12)
    model = randomise_(tiny("hex", "D6")).double()
    mlp = model.blocks[0].mlp
    x = torch.randn(2, 4, model.embed_dim, dtype=torch.float64)
    torch.testing.assert_close(mlp(x), mlp.fc2(mlp.act.forward_dense(mlp.fc1(x))), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# fast paths (one gather per dense weight, Fourier bases folded into the MLP, stacked qkv, cached
# weights) against the block-wise / dense references


@pytest.mark.parametrize("name", ["D4", "C4", "D6", "C6", "C3"])
def test_gathered_weight_matrix_matches_blockwise_reference(name):
    G = get_group(name)
    V = FeatureType.regular(G, 2)
    W = FeatureType(G, [k % 3 + 1 for k in range(len(G.irreps))])
    lin = randomise_(IrrepLinear(V, W)).double()
    torch.testing.assert_close(lin.weight_matrix(), lin.weight_matrix_reference(), rtol=0, atol=1e-15)
    b = lin.bias_vector()
    outside = np.setdiff1d(np.arange(W.dim), W.trivial_index)
    assert b[outside].abs().max() == 0 and torch.equal(b[W.trivial_index], lin.bias)
    x = torch.randn(3, V.dim, dtype=torch.float64)
    torch.testing.assert_close(lin(x), lin.forward_blockwise(x), rtol=0, atol=1e-12)
    # Gradients reach every irrep-wise block of the flat weight through the gather.
    lin(x).pow(2).sum().backward()
    sizes = [w.numel() for w in lin.weight_blocks()]
    assert len(sizes) > 1 and all(g.abs().max() > 0 for g in lin.weight.grad.split(sizes))


@pytest.mark.parametrize("spaces", ["regular", "mixed"])
@pytest.mark.parametrize("name", ["D4", "C6"])
def test_folded_mlp_matches_fourier_reference(name, spaces):
    from eqvit.nn.irrep_blocks import IrrepMlp

    G = get_group(name)
    V = FeatureType.regular(G, 2)
    space_list = [("regular", 2)] if spaces == "regular" else [("regular", 1)] + [(H, 1) for H in G.subgroups()]
    mlp = randomise_(IrrepMlp(V, FourierActivation.from_spaces(G, space_list))).double()
    w1, _, w2, _ = mlp.folded_weights()
    assert w1.shape == (mlp.act.basis.shape[0], V.dim) and w2.shape == (V.dim, mlp.act.basis.shape[0])  # hidden |X|
    x = torch.randn(2, 5, V.dim, dtype=torch.float64)
    y = mlp(x)
    torch.testing.assert_close(y, mlp.forward_reference(x), rtol=0, atol=1e-10)
    assert all(rel_err(mlp(V.act(g, x)), V.act(g, y)) < TOL for g in range(G.order))
    # Same gradients as the reference path.
    grads = torch.autograd.grad(y.square().sum(), list(mlp.parameters()))
    ref = torch.autograd.grad(mlp.forward_reference(x).square().sum(), list(mlp.parameters()))
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_fast_norm_matches_reference_for_default_and_restricted_centres():
    G = get_group("D4")
    V = FeatureType(G, [2, 1, 3, 1, 2])
    x = torch.randn(4, 3, V.dim, dtype=torch.float64) + 0.5
    for center in (None, np.array([0, 3, 5, 9])):  # contiguous trivial block / scattered (restricted) centre
        norm = randomise_(IrrepLayerNorm(V, center=center)).double()
        torch.testing.assert_close(norm(x), norm.forward_reference(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["coupled", "irrepwise"])
def test_stacked_qkv_attention_matches_per_head_reference(layout):
    G = get_group("C4")
    V = FeatureType.regular(G, 3)
    heads = coupled_heads(V, 3) if layout == "coupled" else irrepwise_heads(V, 3)
    attn = randomise_(IrrepAttention(V, heads)).double().eval()
    x = torch.randn(2, 5, V.dim, dtype=torch.float64)
    q, k, v = attn.q(x), attn.k(x), attn.v(x)
    out = torch.zeros_like(x)
    for h in heads:
        scores = (q[..., h] @ k[..., h].transpose(-1, -2)) / len(h) ** 0.5
        out[..., h] = scores.softmax(-1) @ v[..., h]
    torch.testing.assert_close(attn(x), attn.proj(out), rtol=0, atol=1e-12)


def test_weights_follow_parameter_updates_and_fold_freezes_them():
    """The training form derives its weights afresh on every call: after an optimizer step, an in-place
    change, load_state_dict or a dtype change it computes what a fresh copy computes. ``eqvit.fold``
    freezes them: the folded copy keeps the function it was folded at, and folding again follows."""
    model = randomise_(tiny("square", "D4", drop_path_rate=0.0, attn_drop_rate=0.0, head_drop_rate=0.0)).double()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    model.eval()

    def fresh(m):
        with torch.no_grad():
            return copy.deepcopy(m)(x)

    with torch.no_grad():
        y0 = model(x)
        folded = eqvit.fold(model)
        torch.testing.assert_close(folded(x), y0, rtol=1e-12, atol=1e-12)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).square().sum().backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        y1 = model(x)
        assert rel_err(y1, y0) > 1e-6
        torch.testing.assert_close(y1, fresh(model), rtol=0, atol=0)
        torch.testing.assert_close(folded(x), y0, rtol=1e-12, atol=1e-12)  # frozen at folding time
        torch.testing.assert_close(eqvit.fold(model)(x), y1, rtol=1e-12, atol=1e-12)
        for p in model.parameters():
            p.mul_(1.01)
        y2 = model(x)
        torch.testing.assert_close(y2, fresh(model), rtol=0, atol=0)
    other = randomise_(tiny("square", "D4"), seed=7).double().eval()
    with torch.no_grad():
        other(x)
        other.load_state_dict(model.state_dict())
        torch.testing.assert_close(other(x), y2, rtol=0, atol=0)
        other.float()
        assert other(x.float()).dtype == torch.float32
        other.double()
        assert rel_err(other(x), y2) < 1e-5
        restricted = eqvit.restrict(model, "C4")
        assert rel_err(restricted(x), y2) <= TOL


# ------------------------------------------------------------------------------------------------
# cached patch filters (F = W E), square patches by one strided conv, cached APE, six-op LayerNorm


def _grads(out: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    return torch.autograd.grad((out * weight).sum(), inputs)


@pytest.mark.parametrize(("grid", "group"), [("square", "D4"), ("square", "C2"), ("hex", "D6"), ("hex", "C3")])
def test_patch_tokens_and_ape_match_references_with_gradients(grid, group):
    """Square tokenizers embed by ``F.conv2d`` with the cached filters, hexagonal ones by gather +
    ``F.linear``; both equal the gather-unfold with the block-wise reference filters, and the cached
    APE equals its einsums, in values and in gradients (parameters and input)."""
    G = get_group(group)
    V = FeatureType.regular(G, 2)
    if grid == "square":
        tok, shape = SquarePatchTokenizer(G, 12, 4, 2, V), (12, 12)
    else:
        hexgrid = HexPatchGrid(2, 3)
        tok, shape = HexPatchTokenizer(G, hexgrid, 2, V), (hexgrid.num_points,)
    tok = randomise_(tok).double()
    ape = randomise_(InvariantAPE(G, tok.centers, V)).double()
    x = torch.randn(2, 2, *shape, dtype=torch.float64, requires_grad=True)
    params = list(tok.embed.parameters())
    y, y_ref = tok.patch_tokens(x), tok.patch_tokens_reference(x)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for a, b in zip(_grads(y, [x, *params]), _grads(y_ref, [x, *params])):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    p, p_ref = ape.embedding(), ape.embedding_reference()
    torch.testing.assert_close(p, p_ref, rtol=0, atol=1e-12)
    ape_params = list(ape.parameters())
    for a, b in zip(_grads(p, ape_params), _grads(p_ref, ape_params)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(tok(x), torch.cat([tok(x)[:, :1], y_ref], dim=1), rtol=0, atol=1e-10)
    assert tok.embed.filters().requires_grad and ape.embedding().requires_grad


def test_layer_norm_matches_reference_with_gradients_and_eps():
    G = get_group("D4")
    V = FeatureType(G, [2, 1, 3, 1, 2])
    for center in (None, np.array([0, 3, 5, 9])):
        norm = randomise_(IrrepLayerNorm(V, center=center)).double()
        x = torch.randn(4, 3, V.dim, dtype=torch.float64, requires_grad=True)
        x_const = torch.zeros(1, 2, V.dim, dtype=torch.float64)  # a token that centres to zero
        x_const[..., norm.center_mask.bool()] = 0.7
        for inp in (x + 0.5, x_const.requires_grad_()):
            params = [inp if inp.requires_grad else x, *norm.parameters()]
            y, y_ref = norm(inp), norm.forward_reference(inp)
            torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
            for a, b in zip(_grads(y, params), _grads(y_ref, params)):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
        # eps is read through the cache: changing it takes effect
        with torch.no_grad():
            norm(x)
            norm.eps = 0.5
            torch.testing.assert_close(norm(x), norm.forward_reference(x), rtol=0, atol=1e-12)


def _block_parts(layout: str):
    from eqvit.nn.irrep_blocks import irrep_block

    G = get_group("D4")
    V = FeatureType.regular(G, 3)
    heads = coupled_heads(V, 3) if layout == "coupled" else irrepwise_heads(V, 3)
    block = randomise_(irrep_block(V, heads, FourierActivation.from_spaces(G, [("regular", 2)]))).double()
    return V, block


@pytest.mark.parametrize("layout", ["coupled", "irrepwise"])
def test_folded_block_is_the_block_with_its_weights_fixed(layout):
    """Each layer of a block folds by itself: the same function, weights fixed at fold time."""
    V, block = _block_parts(layout)
    x = torch.randn(2, 5, V.dim, dtype=torch.float64)
    with torch.no_grad():
        folded = eqvit.fold(block)
        torch.testing.assert_close(folded(x), block(x), rtol=0, atol=1e-11)
        assert folded.norm1.in_type == block.norm1.in_type and folded.mlp.out_type == block.mlp.out_type
        block.norm2.weight.add_(0.3)  # folded: the copy keeps the weights it was built with
        assert rel_err(folded(x), block(x)) > 1e-4


@pytest.mark.parametrize(("grid", "group"), [("square", "D4"), ("hex", "D3")])
def test_irrep_vit_equals_the_plain_composition(grid, group):
    model = randomise_(tiny(grid, group)).double().eval()
    x = torch.randn(2, 3, *model.domain.shape, dtype=torch.float64) if grid == "square" else None
    if x is None:
        x = torch.randn(2, 3, len(model.domain.points), dtype=torch.float64)
    with torch.no_grad():
        tokens = model.embed_tokens(x)
        for block in model.blocks:
            tokens = block(tokens, None, model.num_prefix_tokens)
        features = model.readout(model.norm(tokens))  # the invariants of every token
        assert features.shape == (2, tokens.shape[1], model.num_features) and model.num_features < model.embed_dim
        torch.testing.assert_close(model.forward_features(x), features, rtol=0, atol=1e-12)
        torch.testing.assert_close(model(x), model.head.fc(features[:, 0]), rtol=0, atol=1e-12)


def test_fold_folds_a_norm_with_another_centre():
    model = randomise_(tiny("square", "D4")).double().eval()
    V = model.token_type
    model.blocks[1].norm2 = randomise_(IrrepLayerNorm(V, center=V.trivial_index[:2])).double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    folded = eqvit.fold(model)
    assert not isinstance(folded.blocks[1].norm2, IrrepLayerNorm)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-12, atol=1e-12)


def test_token_invariants_with_a_restricted_grouping():
    """Scattered trivial coordinates and groups of unequal size (a restricted model's grouping)."""
    V = FeatureType.regular(get_group("D4"), 2)
    groups = [np.array([1]), np.array([2, 3, 10]), np.array([4, 5])]
    readout = TokenInvariants(V, trivial=np.array([0, 9]), groups=groups)
    tokens = torch.randn(3, 4, V.dim, dtype=torch.float64)
    expected = torch.cat([tokens[..., [0, 9]], torch.stack([tokens[..., g].norm(dim=-1) for g in groups], -1)], -1)
    torch.testing.assert_close(readout(tokens), expected, rtol=0, atol=1e-12)
