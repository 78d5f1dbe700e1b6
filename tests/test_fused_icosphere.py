"""The icosphere tokenizer's inference form factored over a patch's turns (:mod:`eqvit.nn.fused_icosphere`):
the factors rebuild the turned kernels, and the compiled passes compute what the dense forms compute."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import eqvit
from eqvit.kernels.icosphere import IcosphereC3Kernel
from eqvit.nn.fused import FrozenIcosphereLift, FrozenIcosphereUnpatchify
from eqvit.nn.fused_icosphere import (
    HALF_ROOT3,
    C3IcosphereLift,
    C3IcosphereUnpatchify,
    c3_dense,
    c3_factors,
    c3_planes,
    tap_orbits,
)
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed, IcosphereUnpatchify, icosphere_lifting

KERNEL = IcosphereC3Kernel.load(warn=False)
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="no C++ compiler builds eqvit/kernels/icosphere_c3.cpp here")
INPUT_LEVEL, PATCH_LEVEL = 3, 1  # 642 vertices, 80 patches of 15 taps (5 orbits), 240 tokens


def test_the_taps_of_a_patch_fall_into_orbits_of_the_turn():
    taps = icosphere_lifting(INPUT_LEVEL, PATCH_LEVEL).orientation_taps
    orbits = tap_orbits(taps)
    assert orbits.shape == (taps.shape[1] // 3, 3)
    assert sorted(orbits.reshape(-1).tolist()) == list(range(taps.shape[1]))  # a partition of the taps
    turn = torch.from_numpy(taps[1].copy())
    assert torch.equal(turn[orbits[:, 0]], orbits[:, 1]) and torch.equal(turn[orbits[:, 1]], orbits[:, 2])
    with pytest.raises(ValueError, match="turns 0, 1, 2"):
        tap_orbits(taps[[1, 0, 2]])
    fixed = torch.arange(6).expand(3, 6).clone()  # a "turn" that moves nothing
    with pytest.raises(ValueError, match="order 3"):
        tap_orbits(fixed)


def _turned_blocks(A: int, K: int) -> torch.Tensor:
    """Blocks [3, 3, A, K] that depend on r + s only, as a turned kernel's do."""
    kernel = torch.randn(3, A, K, dtype=torch.float64)
    return torch.stack([torch.stack([kernel[(t + r) % 3] for r in range(3)]) for t in range(3)])


def test_factors_over_the_turns_rebuild_the_blocks_and_refuse_others():
    blocks = _turned_blocks(4, 5)
    mean, turning = c3_factors(blocks)
    assert mean.shape == (4, 5) and turning.shape == (8, 10)
    assert (c3_dense(mean, turning) - blocks).abs().max() <= 1e-14
    # the factored products compute the three outputs of the dense one
    x = torch.randn(3, 5, dtype=torch.float64)
    dense = torch.einsum("trak,rk->ta", blocks, x)
    z = mean @ x.sum(0)
    u, v = (turning @ torch.cat([x[0] - (x[1] + x[2]) / 2, x[1] - x[2]])).split(4)
    assert torch.allclose(torch.stack([z + u, z + v, z - u - v]), dense, atol=1e-13)
    with pytest.raises(ValueError, match="sum alike"):
        c3_factors(torch.randn(3, 3, 4, 5, dtype=torch.float64))


def test_four_real_products_compute_the_turned_blocks_and_refuse_what_does_not_commute_with_the_turn():
    """Gauss's three products for the complex turning block, plus the mean's, rebuild the dense map."""
    blocks = _turned_blocks(4, 5)
    planes = c3_planes(*c3_factors(blocks))
    assert planes.shape == (4, 4, 5)
    x = torch.randn(3, 5, dtype=torch.float64)
    a, b = x[0] - (x[1] + x[2]) / 2, HALF_ROOT3 * (x[1] - x[2])
    y = planes @ torch.stack([x.sum(0), a, b, a - b]).unsqueeze(-1)  # [4, 4, 1]
    z, u, w = y[0, :, 0], (y[1] + y[2])[:, 0], HALF_ROOT3 * (y[3] - y[1] + y[2])[:, 0]
    dense = torch.einsum("trak,rk->ta", blocks, x)
    assert torch.allclose(torch.stack([z + u, z - u / 2 + w, z - u / 2 - w]), dense, atol=1e-13)
    mean, turning = c3_factors(blocks)
    broken = turning.clone()
    broken[4, 0] += 1e-3  # a v row that no longer follows the u rows: the block stops commuting with the turn
    with pytest.raises(ValueError, match="does not commute"):
        c3_planes(mean, broken)
    with pytest.raises(ValueError, match="expected a mean block"):
        c3_planes(mean, turning[:, :6])


def _pair(cls_frozen, cls_c3, module):
    return cls_frozen(module), cls_c3(module, KERNEL)


def _assert_matches(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Within round-off of the dense form, relative to its largest value (the sums run in another order)."""
    tolerance = 1e-13 if expected.dtype == torch.float64 else 1e-5
    assert (got - expected).abs().max() <= tolerance * expected.abs().max()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 3])
def test_factored_lifting_computes_the_dense_one(dtype, batch):
    torch.manual_seed(0)
    embed = IcospherePatchEmbed(4, 16, INPUT_LEVEL, PATCH_LEVEL).to(dtype)
    dense, factored = _pair(FrozenIcosphereLift, C3IcosphereLift, embed)
    x = torch.randn(batch, 642, 4, dtype=dtype).transpose(1, 2)  # channels-last strides: any layout binds
    with torch.no_grad():
        expected, got = dense(x), factored(x)
    assert got.shape == expected.shape == (batch, 240, 16)
    _assert_matches(got, expected)
    assert torch.equal(factored(x), got)  # the kept call of this layout computes the same
    assert len(factored._kept) == 1


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("channels", [3, 7])  # a compile-time channel count, and one at run time
def test_factored_unpatchify_computes_the_dense_one(dtype, batch, channels):
    torch.manual_seed(0)
    head = IcosphereUnpatchify(16, channels, INPUT_LEVEL, PATCH_LEVEL).to(dtype)
    dense, factored = _pair(FrozenIcosphereUnpatchify, C3IcosphereUnpatchify, head)
    tokens = torch.randn(batch, 240, 16, dtype=dtype)
    expected, got = dense(tokens), factored(tokens)
    assert got.shape == expected.shape == (batch, channels, 642)
    _assert_matches(got, expected)
    assert torch.equal(factored(tokens), got)


def _random_layer_norm(width: int, dtype: torch.dtype, eps: float = 1e-5) -> torch.nn.LayerNorm:
    """A LayerNorm whose affine is far from the identity, so that folding it counts."""
    norm = torch.nn.LayerNorm(width, eps=eps).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0), norm.bias.normal_()
    return norm


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 3])
def test_unpatchify_with_the_final_norm_folded_in_computes_norm_then_unpatchify(dtype, batch):
    """The LayerNorm's affine in the planes and bias, the normalisation in the pass that reads the tokens."""
    torch.manual_seed(0)
    head = IcosphereUnpatchify(16, 3, INPUT_LEVEL, PATCH_LEVEL).to(dtype)
    norm = _random_layer_norm(16, dtype, eps=1e-3)
    folded = C3IcosphereUnpatchify(head, KERNEL, norm=norm)
    tokens = 3.0 + 2.0 * torch.randn(batch, 240, 16, dtype=dtype)  # far from normalised: mean and scale count
    with torch.no_grad():
        expected, got = FrozenIcosphereUnpatchify(head)(norm(tokens)), folded(tokens)
    _assert_matches(got, expected)
    assert len(folded._kept) == 1  # the compiled passes ran
    graded = tokens.clone().requires_grad_(True)  # the dense form applies the norm first
    _assert_matches(folded(graded), expected)
    with pytest.raises(ValueError, match="LayerNorm over the tokens' 16 channels"):
        C3IcosphereUnpatchify(head, KERNEL, norm=torch.nn.LayerNorm(8))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 3])
def test_tiles_of_patches_that_the_patch_count_leaves_part_empty(dtype, batch):
    """20 patches a sample: the last tile of 8 float32 patches is half full. Width 28 and 5 orbits x 7
    channels: products with full and partial blocks of rows."""
    torch.manual_seed(0)
    embed = IcospherePatchEmbed(7, 28, 2, 0).to(dtype)  # 162 vertices, 20 patches of 15 taps
    head = IcosphereUnpatchify(28, 7, 2, 0).to(dtype)
    norm = _random_layer_norm(28, dtype)
    x = torch.randn(batch, 7, 162, dtype=dtype)
    with torch.no_grad():
        tokens = FrozenIcosphereLift(embed)(x)
        _assert_matches(C3IcosphereLift(embed, KERNEL)(x), tokens)
        expected = FrozenIcosphereUnpatchify(head)(norm(tokens))
        folded = C3IcosphereUnpatchify(head, KERNEL, norm=norm)
        _assert_matches(folded(tokens), expected)
    assert len(folded._kept) == 1


@needs_kernel
def test_outside_the_kernels_domain_the_dense_forms_run():
    """Gradients (ctypes writes are invisible to autograd), bf16 and strided tokens take the dense form."""
    embed = IcospherePatchEmbed(3, 8, INPUT_LEVEL, PATCH_LEVEL)
    head = IcosphereUnpatchify(8, 3, INPUT_LEVEL, PATCH_LEVEL)
    lift, unpatchify = C3IcosphereLift(embed, KERNEL), C3IcosphereUnpatchify(head, KERNEL)
    x = torch.randn(2, 3, 642, requires_grad=True)
    tokens = lift(x)
    (grad,) = torch.autograd.grad(tokens.sum(), x)
    assert torch.allclose(tokens, FrozenIcosphereLift(embed)(x), atol=1e-6) and grad.abs().sum() > 0
    assert not lift._kept  # nothing kept for a path that is not the kernel's
    lift(x.detach())  # keeps the float32 layout, which CPU autocast must not take (bf16 between the passes)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(lift(x.detach()), FrozenIcosphereLift(embed)(x.detach()))
    half = torch.randn(2, 240, 8).bfloat16()
    assert torch.equal(unpatchify.to(torch.bfloat16)(half), FrozenIcosphereUnpatchify(head).to(torch.bfloat16)(half))
    strided = torch.randn(2, 8, 240).transpose(1, 2)
    unpatchify = C3IcosphereUnpatchify(head, KERNEL)
    assert torch.allclose(unpatchify(strided), FrozenIcosphereUnpatchify(head)(strided), atol=1e-6)
    assert not unpatchify._kept


@needs_kernel
def test_kept_calls_are_checked_per_layout_and_follow_the_module():
    torch.manual_seed(0)
    head = IcosphereUnpatchify(8, 3, INPUT_LEVEL, PATCH_LEVEL)
    unpatchify = C3IcosphereUnpatchify(head, KERNEL)
    unpatchify(torch.randn(1, 240, 8))
    with pytest.raises(ValueError, match="scatter plan does not fit"):  # 79 patches: a new layout, checked
        unpatchify(torch.randn(1, 237, 8))
    tokens = torch.randn(2, 240, 8, dtype=torch.float64)
    cast = unpatchify.double()  # new float64 factors: the float32 call is dropped
    assert not cast._kept
    assert (cast(tokens) - head.double()(tokens)).abs().max() <= 1e-13 * head.double()(tokens).abs().max()
    copied = copy.deepcopy(cast)
    assert not copied._kept and copied.kernel is KERNEL
    assert not pickle.loads(pickle.dumps(cast))._kept
    with torch.no_grad():  # a factor edited in place is what the kept call computes with
        cast.orbit_bias.add_(1.0)
    # every patch tap gets 1 more, summed over the three tokens: each vertex's average moves by 1/3
    assert torch.allclose(cast(tokens), head.double()(tokens) + 1 / 3, atol=1e-12)


@needs_kernel
def test_a_corrupt_scatter_plan_is_refused_where_it_is_bound():
    head = IcosphereUnpatchify(8, 3, INPUT_LEVEL, PATCH_LEVEL)
    unpatchify = C3IcosphereUnpatchify(head, KERNEL)
    with torch.no_grad():
        unpatchify.scatter_row[5] = 10**6  # would read far outside the orbit values
    with pytest.raises(ValueError, match="scatter plan does not fit"):
        unpatchify(torch.randn(1, 240, 8))


@needs_kernel
def test_fuse_factors_so3vit_tokenizer_and_head_and_keeps_it_exact():
    from randomise import randomise_

    model = randomise_(eqvit.models.create_model("so3vit_tiny")).double().eval()
    fused = eqvit.fuse(model)
    assert isinstance(fused.tokenizer, C3IcosphereLift) and isinstance(fused.head, C3IcosphereUnpatchify)
    # the final norm is read by the unpatchify: the features are the tokens before it, as with timm's fc_norm
    assert isinstance(fused.norm, torch.nn.Identity) and fused.head.norm_eps == model.norm.eps
    x = model.domain.random_input(2, model.in_chans)
    with torch.no_grad():
        assert (fused(x) - model(x)).abs().max() <= 1e-12 * model(x).abs().max()
        assert torch.equal(fused.forward_head(fused.forward_features(x)), fused(x))
        assert (model.norm(fused.forward_features(x)) - model.forward_features(x)).abs().max() <= 1e-12


@needs_kernel
def test_binding_refuses_inputs_and_factors_of_the_wrong_shape():
    orbit_vertex = torch.zeros(2, 3, 3, dtype=torch.int64)
    planes, bias = KERNEL.pack_planes(torch.randn(4, 4, 9)), torch.randn(4)  # 3 orbits x 3 channels -> 4
    KERNEL.bind_lift(torch.randn(1, 3, 10), orbit_vertex, planes, bias)
    with pytest.raises(ValueError, match=r"expected x \[B, C, V\]"):
        KERNEL.bind_lift(torch.randn(3, 10), orbit_vertex, planes, bias)
    with pytest.raises(ValueError, match=r"expected packed weight planes \[4, 48\]"):  # 4 channels: 12 orbit values
        KERNEL.bind_lift(torch.randn(1, 4, 10), orbit_vertex, planes, bias)
    with pytest.raises(ValueError, match=r"expected packed weight planes"):
        KERNEL.bind_lift(torch.randn(1, 3, 10), orbit_vertex, planes[:3].contiguous(), bias)
    with pytest.raises(ValueError, match=r"expected packed weight planes"):
        KERNEL.bind_lift(torch.randn(1, 3, 10), orbit_vertex, planes.flatten(), bias)
    with pytest.raises(ValueError, match=r"expected weight planes \[4, J, K\]"):
        KERNEL.pack_planes(torch.randn(3, 4, 9))


@needs_kernel
def test_packed_planes_hold_blocks_of_rows_in_k_major_order():
    """The products read each block of ``row_block`` rows (the last one shorter) one k at a time."""
    block = KERNEL.row_block
    J, K = 2 * block + 5, 7
    planes = torch.arange(4 * J * K, dtype=torch.float64).view(4, J, K)
    packed = KERNEL.pack_planes(planes)
    assert packed.shape == (4, J * K)
    for j0, rows in [(0, block), (block, block), (2 * block, 5)]:
        stored = packed[:, j0 * K : (j0 + rows) * K].view(4, K, rows)
        assert torch.equal(stored, planes[:, j0 : j0 + rows].transpose(1, 2))
