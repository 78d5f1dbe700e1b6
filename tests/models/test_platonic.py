"""Platonic Transformers: layers on regular features, frame RoPE, and the three model families.

Group actions come from geometry: point clouds rotate their positions (``pos @ g^T``), images
permute pixels by where ``g`` sends each pixel centre of ``model.domain.points``, icosphere fields
permute vertices by where ``g`` sends each vertex. Regular features permute frames by the Cayley
table, ``(L_g f)(R_j) = f(R_{cayley[g^-1, j]})``, the definition the seed's layers commute with.
"""

from __future__ import annotations

import re
from functools import partial

import helpers
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import eqvit
from eqvit.groups import get_group
from eqvit.models.platonic import sphere_frames
from eqvit.nn.platonic import InvariantPoolHead, PlatonicAttention, platonic_block
from eqvit.nn.posenc.frame_rope import FrameRoPE, rotate_pairs
from eqvit.nn.regular import (
    FOURIER_COST_RATIO,
    GroupConvLinear,
    LiftToGroup,
    RegularLayerNorm,
    RegularLayerScale,
    frame_action,
)
from eqvit.testing import EquivarianceError, assert_equivariant

# Layer-level checks use a fixed noise scale (0.5 unless a test says otherwise).
randomise_ = partial(helpers.randomise_, scale=0.5)

GROUPS = ["C1", "C4", "C5", "D4", "D6", "T", "O", "I"]


def max_frame_error(group, layer: nn.Module, x: torch.Tensor) -> float:
    """``max_g |layer(L_g x) - L_g layer(x)| / max |layer(x)|`` over every element."""
    y = layer(x)
    scale = y.abs().max().item()
    assert scale > 1e-3, "vacuous check: the output is (near) zero"
    return (
        max(
            (layer(frame_action(group, g, x)) - frame_action(group, g, y)).abs().max().item()
            for g in range(group.order)
        )
        / scale
    )


# ------------------------------------------------------------------------------------------------
# layers on regular features


@pytest.mark.parametrize("name", GROUPS)
def test_group_conv_cayley_and_fourier_forms_agree(name):
    group = get_group(name)
    torch.manual_seed(0)
    cayley = randomise_(GroupConvLinear(group, 5, 3, impl="cayley").double())
    fourier = GroupConvLinear(group, 5, 3, impl="fourier").double()
    fourier.load_state_dict(cayley.state_dict())
    x = torch.randn(4, 7, group.order * 5, dtype=torch.float64)
    a, b = cayley(x), fourier(x)
    assert a.abs().max() > 0.1
    torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", GROUPS)
@pytest.mark.parametrize("impl", ["cayley", "fourier"])
@pytest.mark.parametrize("rows", [1, 3])  # the Cayley form gathers input windows for 1 row (2 * 1 < 6)
def test_group_conv_is_equivariant(name, impl, rows):
    group = get_group(name)
    layer = randomise_(GroupConvLinear(group, 4, 6, impl=impl).double())
    x = torch.randn(rows, group.order * 4, dtype=torch.float64)
    assert max_frame_error(group, layer, x) < 1e-12


@pytest.mark.parametrize("name", GROUPS)
def test_group_conv_input_windows_match_the_dense_matrix(name):
    """impl="windows" (for few rows, e.g. a pooled token) gathers the input; values and gradients equal the
    dense matrix product of impl="cayley"."""
    group = get_group(name)
    torch.manual_seed(1)
    layer = randomise_(GroupConvLinear(group, 5, 12, impl="windows").double())
    x = torch.randn(2, 2, group.order * 5, dtype=torch.float64, requires_grad=True)
    dense, bias = layer.gather_dense()
    reference = F.linear(x, dense, bias)
    out = layer(x)
    torch.testing.assert_close(out, layer.forward_windows(x), rtol=0, atol=0)
    torch.testing.assert_close(out, reference, rtol=1e-12, atol=1e-12)
    seed = torch.randn_like(out)
    grads = torch.autograd.grad((out * seed).sum(), [x, layer.weight, layer.bias])
    expected = torch.autograd.grad((reference * seed).sum(), [x, layer.weight, layer.bias])
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_group_conv_dense_weight_blocks_follow_the_seed():
    """Block (R, R') of the dense matrix is the kernel at R^-1 R'."""
    group = get_group("O")
    layer = randomise_(GroupConvLinear(group, 2, 3).double())
    dense = layer.dense_weight().reshape(group.order, 3, group.order, 2)
    elements = group.elements
    for r, s in [(0, 0), (3, 7), (11, 2), (23, 19)]:
        h = group.index_of(elements[r].T @ elements[s])
        torch.testing.assert_close(dense[r, :, s], layer.weight[h], rtol=0, atol=0)


def test_group_conv_parameter_count_is_order_times_smaller():
    group = get_group("I")
    layer = GroupConvLinear(group, 8, 16, bias=False)
    assert layer.weight.numel() == group.order * 8 * 16
    assert layer.dense_weight().numel() == group.order * layer.weight.numel()


def test_auto_implementation_follows_the_cost_rule():
    small = GroupConvLinear(get_group("C4"), 2, 2)
    large = GroupConvLinear(get_group("I"), 32, 32)
    assert small.impl == "cayley" and large.impl == "fourier"
    assert large.fourier_cost() < FOURIER_COST_RATIO * large.cayley_cost()
    assert small.fourier_cost() >= FOURIER_COST_RATIO * small.cayley_cost()


@pytest.mark.parametrize("name", ["D4", "T", "I"])
def test_lifting_scalars_and_vectors(name):
    group = get_group(name)
    lift = LiftToGroup(group).double()
    d = group.dim
    scalars = torch.randn(2, 5, 3, dtype=torch.float64)
    vectors = torch.randn(2, 5, 2, d, dtype=torch.float64)
    out = lift(scalars, vectors).reshape(2, 5, group.order, 3 + 2 * d)
    R = torch.from_numpy(group.elements.copy())
    for g in range(group.order):
        torch.testing.assert_close(out[:, :, g, :3], scalars)  # copied to every frame
        seen = vectors @ R[g]  # row vectors: u^T R = (R^T u)^T
        torch.testing.assert_close(out[:, :, g, 3:].reshape(2, 5, 2, d), seen)
    # Rotating the vectors by h permutes the frames: f(R) = R^T h u = ((h^-1 R)^T u) = (L_h f)(R).
    for h in range(group.order):
        rotated = lift(scalars, vectors @ R[h].T)
        torch.testing.assert_close(rotated, frame_action(group, h, lift(scalars, vectors)), rtol=1e-12, atol=1e-12)


def test_regular_norm_and_layerscale_share_parameters_across_frames():
    group = get_group("T")
    norm = randomise_(RegularLayerNorm(group, 6).double())
    scale = randomise_(RegularLayerScale(group, 6).double())
    x = torch.randn(4, group.order * 6, dtype=torch.float64)
    assert norm.weight.shape == (6,) and scale.gamma.shape == (6,)
    assert max_frame_error(group, norm, x) < 1e-12
    assert max_frame_error(group, scale, x) < 1e-12


class PerFrameLayerScale(nn.Module):
    """The bug a public implementation once had: a LayerScale gamma of shape [|G| * C]."""

    def __init__(self, group_order: int, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, group_order * channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


def test_per_frame_layerscale_breaks_equivariance():
    group = get_group("O")
    x = torch.randn(4, group.order * 6, dtype=torch.float64)
    assert max_frame_error(group, PerFrameLayerScale(group.order, 6).double(), x) > 1e-2

    # ... and in a whole model the check catches it.
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_points_tiny", group="O", init_values=1e-1))
    assert_equivariant(model)  # shared [C] gammas: fine
    for block in model.blocks:
        block.ls1 = PerFrameLayerScale(24, 10)
    with pytest.raises(EquivarianceError):
        assert_equivariant(model)


@pytest.mark.parametrize("scores", ["frames", "invariant"])
@pytest.mark.parametrize("name", ["C4", "D4", "T", "I"])
def test_attention_with_frame_rope_is_equivariant(name, scores):
    """Rotating the positions by g and permuting the frames by L_g leaves attention equivariant."""
    group = get_group(name)
    heads, head_dim = 2, 4
    channels = heads * head_dim
    attn = randomise_(PlatonicAttention(group, channels, heads, scores=scores).double(), scale=0.3)
    pos = torch.randn(2, 9, group.dim, dtype=torch.float64)
    x = torch.randn(2, 9, group.order * channels, dtype=torch.float64)
    rope = FrameRoPE(group, heads, head_dim).double()
    y = attn(x, rope.bind(pos))
    assert y.abs().max() > 1e-2
    R = torch.from_numpy(group.elements.copy())
    for g in range(group.order):
        got = attn(frame_action(group, g, x), rope.bind(pos @ R[g].T))
        assert (got - frame_action(group, g, y)).abs().max() < 1e-12 * max(1.0, y.abs().max().item())


def test_frame_rope_scores_depend_on_relative_positions_seen_from_each_frame():
    group = get_group("T")
    rope = FrameRoPE(group, num_heads=2, head_dim=8).double()
    q = torch.randn(1, 6, group.order * 2, 8, dtype=torch.float64)
    k = torch.randn(1, 6, group.order * 2, 8, dtype=torch.float64)
    pos = torch.randn(1, 6, 3, dtype=torch.float64)

    def scores(p):
        rq, rk = rope.bind(p).rotate_qk_tokens(q, k)
        return torch.einsum("bihd,bjhd->bhij", rq, rk)

    base = scores(pos)
    torch.testing.assert_close(scores(pos + torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)), base)
    assert (scores(pos * 1.5) - base).abs().max() > 1e-2  # relative positions changed: scores change
    rq, _ = rope.bind(pos).rotate_qk_tokens(q, k)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))  # rotations preserve norms


def test_rotate_pairs_is_the_real_rotation_of_adjacent_pairs():
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    angles = torch.randn(5, 4, dtype=torch.float64)
    got = rotate_pairs(x, torch.stack([angles.cos(), angles.sin()], dim=-1))
    x0, x1 = x[..., 0::2], x[..., 1::2]
    expected = torch.stack([x0 * angles.cos() - x1 * angles.sin(), x0 * angles.sin() + x1 * angles.cos()], dim=-1)
    torch.testing.assert_close(got, expected.flatten(-2))
    # reduced precision is rotated in float32 and returned in its own dtype
    half = rotate_pairs(x.bfloat16(), torch.stack([angles.cos(), angles.sin()], dim=-1).float())
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.double(), expected.flatten(-2), atol=5e-2, rtol=2e-2)


def test_frame_rope_takes_unflattened_heads():
    """Platonic attention hands q, k over as strided views [B, N, G, H, D]: same result as [B, N, G H, D]."""
    group = get_group("O")
    rope = FrameRoPE(group, num_heads=2, head_dim=4).double()
    qkv = torch.randn(2, 5, group.order, 3, 2, 4, dtype=torch.float64)
    q, k, _ = qkv.unbind(3)  # non-contiguous views
    pos = torch.randn(2, 5, 3, dtype=torch.float64)
    views = rope.bind(pos).rotate_qk_tokens(q, k)
    flat = rope.bind(pos).rotate_qk_tokens(q.reshape(2, 5, -1, 4), k.reshape(2, 5, -1, 4))
    for a, b in zip(views, flat):
        assert a.shape == (2, 5, group.order * 2, 4)
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_frame_rope_rotates_stacked_qk_like_separate_q_and_k():
    """``rotate_qk_stacked_`` (in place, one op: what Platonic attention calls) equals the base
    class's generic default and ``rotate_qk_tokens``, for fixed and per-batch positions, with prefix
    tokens, on a strided view into a stacked qkv tensor and in reduced precision."""
    from eqvit.nn.posenc.base import PositionalScheme

    group = get_group("C4")
    qkv = torch.randn(2, 9, 3, group.order * 2, 6, dtype=torch.float64)
    fixed = FrameRoPE(group, num_heads=2, head_dim=6, positions=torch.randn(7, 2)).double()
    bound = FrameRoPE(group, num_heads=2, head_dim=6).double().bind(torch.randn(2, 9, 2, dtype=torch.float64))
    for rope, prefix in ((fixed, 2), (bound, 0)):
        qk = qkv[:, :, :2]  # q and k: a strided view
        stacked = qkv.clone()
        got = rope.rotate_qk_stacked_(stacked[:, :, :2], prefix)
        assert got.data_ptr() == stacked.data_ptr()  # rotated where it lies
        assert torch.equal(stacked[:, :, 2], qkv[:, :, 2])  # v untouched
        generic = PositionalScheme.rotate_qk_stacked_(rope, qk.clone(), prefix)
        torch.testing.assert_close(got, generic, rtol=0, atol=1e-15)
        q, k = rope.rotate_qk_tokens(qk[:, :, 0], qk[:, :, 1], prefix)
        torch.testing.assert_close(got, torch.stack([q, k], dim=2), rtol=0, atol=1e-15)
        assert torch.equal(got[:, :prefix], qk[:, :prefix])
        assert not torch.allclose(got[:, prefix:], qk[:, prefix:])
    expected = fixed.rotate_qk_stacked_(qkv[:, :, :2].clone(), 2)
    half = fixed.float().rotate_qk_stacked_(qkv[:, :, :2].bfloat16(), 2)  # rotated in float32, copied back
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.double(), expected, rtol=2e-2, atol=2e-2)


def test_platonic_attention_rotates_in_place_with_correct_gradients():
    """The in-place rotation of q, k inside the stacked projection gives the same outputs and input
    gradients as rotating copies (the generic scheme path)."""
    from eqvit.nn.platonic import PlatonicAttention
    from eqvit.nn.posenc.base import PositionalScheme

    group = get_group("D4")
    torch.manual_seed(0)
    attn = randomise_(PlatonicAttention(group, channels=8, num_heads=2).double())
    rope = FrameRoPE(group, num_heads=2, head_dim=4, positions=torch.randn(6, 2)).double()
    x = torch.randn(2, 7, group.order * 8, dtype=torch.float64, requires_grad=True)
    out = attn(x, rope, num_prefix_tokens=1)
    seed = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * seed).sum(), x)

    class Copying(PositionalScheme):  # the generic default: rotate copies, then write them back
        is_rotary = True

        def rotate_qk_tokens(self, q, k, num_prefix_tokens=0):
            return rope.rotate_qk_tokens(q, k, num_prefix_tokens)

    ref = attn(x, Copying(), num_prefix_tokens=1)
    (ref_grad,) = torch.autograd.grad((ref * seed).sum(), x)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    unrotated = attn(x, None, num_prefix_tokens=1)
    assert not torch.allclose(out, unrotated)


def test_frame_rope_with_unshared_frequencies_breaks_equivariance():
    """Frequencies must be shared by all frames (seed App. B): scale them per frame and the check fails."""
    group = get_group("O")
    attn = randomise_(PlatonicAttention(group, 8, 2).double(), scale=0.3)
    pos = torch.randn(1, 7, 3, dtype=torch.float64)
    x = torch.randn(1, 7, group.order * 8, dtype=torch.float64)
    rope = FrameRoPE(group, 2, 4).double()
    per_frame = torch.linspace(0.5, 1.5, group.order * 2, dtype=torch.float64)[:, None]  # [G * H, 1]

    def unshared(p: torch.Tensor):
        cos, sin = rope.cos_sin(p)
        angles = torch.atan2(sin, cos) * per_frame
        return type(rope.bind(p))(angles.cos(), angles.sin())

    y = attn(x, unshared(pos))
    got = attn(frame_action(group, 5, x), unshared(pos @ torch.from_numpy(group.elements[5].T.copy())))
    assert (got - frame_action(group, 5, y)).abs().max() > 1e-3
    shared = attn(frame_action(group, 5, x), rope.bind(pos @ torch.from_numpy(group.elements[5].T.copy())))
    assert (shared - frame_action(group, 5, attn(x, rope.bind(pos)))).abs().max() < 1e-10


@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("name", ["C4", "D4", "O"])
def test_invariant_pool_head_is_invariant_to_the_frames(name, pool):
    group = get_group(name)
    torch.manual_seed(0)
    head = randomise_(InvariantPoolHead(group, channels=3, num_classes=5, pool=pool)).double()
    x = torch.randn(2, 7, group.order * 3, dtype=torch.float64)
    y = head(x)
    assert y.shape == (2, 5)
    for g in range(group.order):
        torch.testing.assert_close(head(frame_action(group, g, x)), y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pool", ["mean", "max"])
def test_invariant_pool_head_pooling_the_wrong_axis_is_not_invariant(pool, monkeypatch):
    """Pooling channels within each frame instead of frames leaves the logits frame-dependent."""
    group = get_group("D4")
    torch.manual_seed(0)
    head = randomise_(InvariantPoolHead(group, channels=3, num_classes=5, pool=pool)).double()
    reduce = {"mean": lambda t: t.mean(-1), "max": lambda t: t.amax(-1)}[pool]
    order = head.pool.order
    monkeypatch.setattr(head.pool, "forward", lambda x: reduce(x.unflatten(-1, (order, -1))).repeat(1, 3)[:, :24])
    x = torch.randn(2, 7, group.order * 3, dtype=torch.float64)
    worst = max((head(frame_action(group, g, x)) - head(x)).abs().max().item() for g in range(group.order))
    assert worst > 1e-3


@pytest.mark.parametrize("pool", ["mean", "max"])
def test_point_cloud_model_is_invariant_with_either_head_pool(pool):
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_points_tiny", group="T", head_pool=pool))
    assert model.head.pool_mode == pool
    assert assert_equivariant(model).max_relative_error < 1e-9


def test_image_and_point_models_default_to_their_measured_head_pools():
    assert eqvit.create_model("platonic_image_tiny").head.pool_mode == "max"
    assert eqvit.create_model("platonic_points_tiny").head.pool_mode == "mean"


# ------------------------------------------------------------------------------------------------
# models


@pytest.mark.parametrize("frames", ["T", "O", "I", "trivial"])
def test_point_cloud_model_is_invariant_to_its_rotations(frames):
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_points_tiny", group=frames))
    expected = {"T": 12, "O": 24, "I": 60, "trivial": 1}[frames]
    assert model.group.order == expected and model.group.dim == 3
    report = assert_equivariant(model)  # float64; the action rotates pos by every element
    assert report.max_relative_error < 1e-9 and len(report.rows) == expected


def test_point_cloud_model_is_invariant_to_point_order_and_translation():
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_points_tiny", group="O")).double().eval()
    gen = torch.Generator().manual_seed(1)
    pos = torch.randn(2, 40, 3, generator=gen, dtype=torch.float64)
    feat = torch.randn(2, 40, 1, generator=gen, dtype=torch.float64)
    y = model(pos, feat)
    perm = torch.randperm(40, generator=gen)
    torch.testing.assert_close(model(pos[:, perm], feat[:, perm]), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(model(pos + torch.tensor([5.0, -2.0, 1.0], dtype=torch.float64), feat), y)


def test_point_cloud_model_with_o_frames_is_not_invariant_to_generic_rotations():
    """O frames give O-invariance, not SO(3)-invariance: a generic rotation changes the logits."""
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_points_tiny", group="O"))
    with pytest.raises(EquivarianceError):
        assert_equivariant(model, "SO3", num_rotations=3)


@pytest.mark.parametrize("frames", ["C4", "D4", "C2", "D2", "D1", "C1"])
@pytest.mark.parametrize("scores", ["frames", "invariant"])
def test_image_model_is_invariant_to_its_frames(frames, scores):
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_image_tiny", group=frames, scores=scores))
    report = assert_equivariant(model)  # pixel permutations derived from model.domain.points
    assert report.max_relative_error < 1e-9 and len(report.rows) == get_group(frames).order


def test_image_model_with_c4_frames_is_not_reflection_invariant():
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_image_tiny", group="C4"))
    with pytest.raises(EquivarianceError):
        assert_equivariant(model, "D4")


def test_image_model_with_learnable_frequencies_and_qk_norm_is_invariant():
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_image_tiny", learnable_freqs=True, qk_norm=True, init_values=0.1))
    assert any("freqs" in name for name, _ in model.named_parameters())
    assert_equivariant(model)


def test_sphere_model_is_equivariant_to_the_icosahedral_group():
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_sphere_tiny"))
    assert model.group.order == 60
    report = assert_equivariant(model, batch_size=1)  # vertex permutations from the icosphere geometry
    assert report.max_relative_error < 1e-9 and len(report.rows) == 60


@pytest.mark.parametrize("frames", ["T", "O"])
def test_sphere_model_with_t_or_o_frames_keeps_the_tetrahedral_subgroup_of_i(frames):
    frame_group, symmetry = sphere_frames(frames)
    assert frame_group.order == {"T": 12, "O": 24}[frames] and symmetry.order == 12
    icosahedral = get_group("I")
    # The kept symmetry is made of icosahedral rotations that are also frames.
    frame_rows = {tuple(np.round(m, 9).ravel()) for m in frame_group.elements}
    ico_rows = {tuple(np.round(m, 9).ravel()) for m in icosahedral.elements}
    kept = {tuple(np.round(m, 9).ravel()) for m in symmetry.elements}
    assert kept == frame_rows & ico_rows
    width = {"T": 48, "O": 48}[frames]
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_sphere_tiny", group=frames, embed_dim=width, depth=1))
    assert_equivariant(model, batch_size=1)


def test_sphere_4x128_width_is_the_nearest_valid_one():
    for frames, width in [("I", 120), ("O", 144), ("T", 120)]:
        model = eqvit.create_model("platonic_sphere_4x128", group=frames, input_level=3, patch_level=1)
        assert model.embed_dim == width and len(model.blocks) == 4


def test_block_prefers_fourier_linears_when_cheaper():
    block = platonic_block(get_group("I"), channels=32, num_heads=1)
    assert block.mlp.fc1.impl == "fourier" and block.attn.qkv.impl == "fourier"


# ------------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("platonic_points_tiny", dict(group="D4"), "frames for 3-D positions must be 3x3 matrices; D4 acts in 2-D"),
        ("platonic_points_tiny", dict(group="Q8"), "unknown group 'Q8'"),
        ("platonic_image_tiny", dict(group="C3"), "C3 does not map the pixels of a square patch onto itself"),
        ("platonic_image_tiny", dict(group="C4", embed_dim=50), "embed_dim 50 must be a multiple of |C4| = 4"),
        ("platonic_points_tiny", dict(group="O", embed_dim=120), "120 gives 5 channels per frame of O"),
        ("platonic_sphere_tiny", dict(group="D4"), "unknown frames 'D4' for the sphere"),
        ("platonic_points_tiny", dict(impl="sparse"), "unknown impl 'sparse'"),
        ("platonic_points_tiny", dict(scores="pooled"), "unknown scores 'pooled'"),
        ("platonic_image_tiny", dict(head_pool="sum"), "unknown frame pooling 'sum'; valid: mean, max"),
        ("platonic_sphere_tiny", dict(head_pool="max"), "head_pool applies to the classifiers"),
    ],
)
def test_bad_configuration_is_a_value_error(name, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        eqvit.create_model(name, **kwargs)


def test_wrong_point_cloud_input_is_a_value_error():
    model = eqvit.create_model("platonic_points_tiny")
    with pytest.raises(ValueError, match=re.escape("expected pos [B, N, 3] and feat [B, N, 1]")):
        model(torch.randn(2, 10, 2), torch.randn(2, 10, 1))
    with pytest.raises(ValueError, match=re.escape("got [2, 10, 3] and [2, 9, 1]")):
        model(torch.randn(2, 10, 3), torch.randn(2, 9, 1))


def test_sphere_model_with_latitude_encoding_keeps_the_rotations_about_z():
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model("platonic_sphere_tiny", symmetry_breaking="latitude", residual=True))
    assert model.group.order == 5
    assert np.allclose(model.group.elements[:, :, 2], [0.0, 0.0, 1.0], atol=1e-12)
    assert_equivariant(model, batch_size=1)
    with pytest.raises(EquivarianceError):
        assert_equivariant(model, "I", batch_size=1)


@pytest.mark.parametrize("impl", ["cayley", "fourier"])
def test_group_conv_fuses_to_its_own_function_and_trains_through_its_kernel(impl):
    import eqvit

    layer = GroupConvLinear(get_group("O"), 4, 4, impl=impl)
    x = torch.randn(3, 24 * 4)
    y = layer(x)  # gradients reach the kernel
    y.sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    folded = eqvit.fold(layer)
    assert not list(folded.parameters()) and folded.out_type == layer.out_type
    with torch.no_grad():
        torch.testing.assert_close(folded(x), layer(x), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(layer(x), y)
