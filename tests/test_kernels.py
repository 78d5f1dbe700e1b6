"""The optional compiled CPU kernels (``eqvit.kernels``): built on first use, the same function as the
PyTorch forms they stand in for, and a clean fallback where they cannot be built."""

from __future__ import annotations

import copy
import pickle
import shutil

import pytest
import torch
from randomise import randomise_

import eqvit
from eqvit import kernels, models
from eqvit.groups import get_group
from eqvit.groups.so3 import wigner_D_blocks
from eqvit.kernels.so3 import SO3RotationKernel, pack_wigner_blocks, turned_wigner_blocks, z_turn_matrices
from eqvit.nn.fused import FrozenIcosphereLift, FrozenIcosphereUnpatchify
from eqvit.nn.fused_so3rope import KernelSO3RoPE
from eqvit.nn.posenc import SO3RoPE
from eqvit.testing import EquivarianceError, assert_equivariant

KERNEL = SO3RotationKernel.load(warn=False)
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="no C++ compiler builds eqvit/kernels/so3_rotate.cpp here")


def random_poses(n: int, seed: int = 0) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
    return q * torch.linalg.det(q).sign()[:, None, None]  # proper rotations


def z_turn(angle: torch.Tensor) -> torch.Tensor:
    c, s = torch.cos(angle), torch.sin(angle)
    zero, one = torch.zeros_like(angle), torch.ones_like(angle)
    return torch.stack(
        [torch.stack([c, -s, zero], -1), torch.stack([s, c, zero], -1), torch.stack([zero, zero, one], -1)], -2
    )


def turned_poses(groups: int, size: int = 3, seed: int = 0) -> torch.Tensor:
    """Poses in groups of ``size`` that differ by turns about their own z-axis, like the icosphere's
    three tokens per patch: ``pose[g size + s] = base[g] Rz(t)``."""
    base = random_poses(groups, seed).repeat_interleave(size, dim=0)
    angles = torch.rand(groups * size, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 6.0
    return base @ z_turn(angles)


def test_turned_wigner_blocks_share_one_set_per_group_and_rebuild_every_token():
    L = 3
    pi = wigner_D_blocks(L, turned_poses(4))
    blocks, turns = turned_wigner_blocks(pi, L)
    assert blocks.shape == (4, 9 + 25 + 49) and turns.shape == (12, 2 * L)
    assert torch.equal(blocks, pack_wigner_blocks(pi[::3], L))
    # token n's matrix is its group's turned by (cos m t, sin m t) on channels (-m, +m) of every order
    group = pi[::3].repeat_interleave(3, dim=0)
    assert (group @ z_turn_matrices(turns, L) - pi).abs().max() < 1e-12
    angles = torch.atan2(turns[:, 1], turns[:, 0])  # the turn t itself, from (cos t, sin t)
    assert torch.allclose(turns.view(12, L, 2)[:, 2], torch.stack([torch.cos(3 * angles), torch.sin(3 * angles)], -1))
    assert turned_wigner_blocks(wigner_D_blocks(L, random_poses(12)), L) is None  # no shared axes
    uneven = torch.cat([turned_poses(2), turned_poses(1, size=2, seed=1)])  # groups of 3, 3 and 2
    assert turned_wigner_blocks(wigner_D_blocks(L, uneven), L) is None
    assert turned_wigner_blocks(pi[:, :1, :1], 0) is None  # L = 0: nothing turns


def test_pack_wigner_blocks_keeps_orders_1_to_L_row_major():
    L = 3
    pi = wigner_D_blocks(L, random_poses(5))
    packed = pack_wigner_blocks(pi, L)
    assert packed.shape == (5, 9 + 25 + 49) and packed.is_contiguous()
    assert torch.equal(packed[:, :9].view(5, 3, 3), pi[:, 1:4, 1:4])
    assert torch.equal(packed[:, 9 + 25 :].view(5, 7, 7), pi[:, 9:16, 9:16])
    assert pack_wigner_blocks(pi[:, :1, :1], 0).shape == (5, 0)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("head_dim", "heads", "max_order", "prefix"),
    [
        (32, 4, None, 0),  # SO3ViT's shapes at width 128: 8 rows, L = 4
        (32, 3, None, 1),  # 6 rows: a partial vector of lanes; a class token left alone
        (9, 1, 2, 0),  # 2 rows, every channel rotated
        (4, 5, 1, 2),  # L = 1
        (1, 2, 0, 0),  # L = 0: nothing moves
        (256, 2, 15, 0),  # the largest order the kernel unrolls
    ],
)
@pytest.mark.parametrize("turned", [False, True])
def test_kernel_rotates_as_the_matmul_does(dtype, head_dim, heads, max_order, prefix, turned):
    N, B = 9, 3
    poses = turned_poses(3) if turned else random_poses(N)
    rope = SO3RoPE(head_dim, poses=poses, max_order=max_order).to(dtype)
    fused = KernelSO3RoPE(rope, KERNEL)
    assert fused.wigner_blocks.dtype == dtype
    assert fused.group == (3 if turned and rope.max_order > 0 else 1)  # the turned form where poses share axes
    qkv = torch.randn(B, N + prefix, 3, heads, head_dim, dtype=torch.float64).to(dtype)
    expected, got = qkv.clone(), qkv.clone()
    rope.rotate_qk_stacked_(expected[:, :, :2], prefix)
    assert fused.rotate_qk_stacked_(got[:, :, :2], prefix).data_ptr() == got.data_ptr()
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert (got - expected).abs().max() <= tolerance
    assert torch.equal(got[:, :, 2], qkv[:, :, 2]) and torch.equal(got[:, :prefix], qkv[:, :prefix])  # v, prefix
    k = rope.rotated_dim
    assert torch.equal(got[..., k:], qkv[..., k:]) and torch.equal(got[..., 0], qkv[..., 0])
    if k > 1:
        assert (got[:, prefix:, :2] - qkv[:, prefix:, :2]).abs().max() > 0.1  # it did rotate


@needs_kernel
def test_a_layout_seen_before_goes_straight_to_the_kept_kernel_call():
    """The checks run once per layout; the kept call rotates later tensors of that layout (here with a
    prefix token, so the offset of the posed rows counts) exactly as the checked path does."""
    rope = SO3RoPE(32, poses=random_poses(7)).double()
    fused = KernelSO3RoPE(rope, KERNEL)
    for batch in (2, 2, 3, 3):  # each layout: first the checked path, then the kept call
        qkv = torch.randn(batch, 8, 3, 4, 32, dtype=torch.float64)
        expected, got = qkv.clone(), qkv.clone()
        rope.rotate_qk_stacked_(expected[:, :, :2], 1)
        fused.rotate_qk_stacked_(got[:, :, :2], 1)
        assert (got - expected).abs().max() <= 1e-12
        assert torch.equal(got[:, :1], qkv[:, :1])  # the prefix token stays
    assert len(fused._kept) == 2
    with pytest.raises(ValueError, match="expected 7 tokens"):  # other layouts are still checked
        fused.rotate_qk_stacked_(torch.randn(2, 7, 2, 4, 32, dtype=torch.float64), 1)


@needs_kernel
def test_a_stream_of_new_layouts_keeps_a_bounded_number_of_calls(monkeypatch):
    from eqvit.nn import kept_calls

    monkeypatch.setattr(kept_calls, "MAX_KEPT", 2)
    rope = SO3RoPE(32, poses=random_poses(7)).double()
    fused = KernelSO3RoPE(rope, KERNEL)
    for batch in range(1, 6):
        qk = torch.randn(batch, 7, 2, 4, 32, dtype=torch.float64)
        expected = rope.rotate_qk_stacked_(qk.clone())
        assert fused.rotate_qk_stacked_(qk).sub(expected).abs().max() <= 1e-12
        assert len(fused._kept) <= 2


@needs_kernel
def test_kept_kernel_calls_follow_the_module_tensors():
    """A new blocks tensor (assigned, or cast with the module) replaces the kept calls' bound one."""
    rope = SO3RoPE(32, poses=random_poses(7)).double()
    fused = KernelSO3RoPE(rope, KERNEL)
    qk = torch.randn(1, 7, 2, 4, 32, dtype=torch.float64)
    fused.rotate_qk_stacked_(qk.clone())  # binds this layout
    other = SO3RoPE(32, poses=random_poses(7, seed=5)).double()
    fused.wigner_blocks = KernelSO3RoPE(other, KERNEL).wigner_blocks
    assert fused.rotate_qk_stacked_(qk.clone()).sub(other.rotate_qk_stacked_(qk.clone())).abs().max() <= 1e-12
    fused.wigner_blocks = KernelSO3RoPE(rope, KERNEL).wigner_blocks
    expected = rope.rotate_qk_stacked_(qk.clone())
    assert fused.rotate_qk_stacked_(qk.clone()).sub(expected).abs().max() <= 1e-12
    cast = fused.float()  # new float32 blocks; a float64 layout kept from before would be stale
    assert not cast._kept
    assert cast.rotate_qk_stacked_(qk.float()).sub(expected).abs().max() <= 1e-5
    assert not copy.deepcopy(cast)._kept  # a copy binds its own blocks


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_split_over_threads_rotates_every_token(threads):
    """Enough tokens for the OpenMP split (>= 64 per call): every token gets its own matrix."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rope = SO3RoPE(32, poses=random_poses(300, seed=1)).double()
        qkv = torch.randn(3, 300, 3, 4, 32, dtype=torch.float64)
        expected, got = qkv.clone(), qkv.clone()
        rope.rotate_qk_stacked_(expected[:, :, :2])
        KernelSO3RoPE(rope, KERNEL).rotate_qk_stacked_(got[:, :, :2])
        assert (got - expected).abs().max() <= 1e-12
    finally:
        torch.set_num_threads(previous)


@needs_kernel
def test_kernel_outside_its_domain_takes_the_matmul():
    """Gradients (ctypes writes are invisible to autograd) and bf16 go through SO3RoPE's matmul."""
    rope = SO3RoPE(16, poses=random_poses(6))
    fused = KernelSO3RoPE(rope, KERNEL)
    qkv = torch.randn(2, 6, 3, 2, 16, requires_grad=True)
    out = fused.rotate_qk_stacked_(qkv.clone()[:, :, :2])
    expected = rope.rotate_qk_stacked_(qkv.clone()[:, :, :2])
    assert torch.allclose(out, expected, atol=1e-6)
    (grad,) = torch.autograd.grad(out.square().sum(), qkv)
    assert torch.allclose(grad[:, :, :2], 2 * qkv[:, :, :2], atol=1e-5)  # a rotation keeps norms
    half = qkv.detach().bfloat16()
    assert torch.equal(
        fused.to(torch.bfloat16).rotate_qk_stacked_(half.clone()[:, :, :2]),
        rope.to(torch.bfloat16).rotate_qk_stacked_(half.clone()[:, :, :2]),
    )
    with pytest.raises(ValueError, match="channel stride 1"):
        KERNEL.rotate_(torch.randn(1, 6, 2, 16, requires_grad=True), fused.wigner_blocks.float(), 3)
    with pytest.raises(ValueError, match="expected blocks"):
        KERNEL.rotate_(torch.randn(1, 5, 2, 16), fused.wigner_blocks.float(), 3)
    turned = KernelSO3RoPE(SO3RoPE(16, poses=turned_poses(2)), KERNEL)  # 6 tokens, L = 3: turns [6, 6]
    rows = torch.randn(1, 6, 2, 16)
    for bad in (turned.turns[:, :4], turned.turns.t().contiguous().t(), turned.turns.double()):
        with pytest.raises(ValueError, match=r"expected contiguous turns \[6, 6\]"):
            KERNEL.rotate_(rows, turned.wigner_blocks, 3, bad)


@needs_kernel
def test_fuse_puts_so3vit_rope_on_the_kernel_and_keeps_it_equivariant():
    model = randomise_(models.create_model("so3vit_tiny")).double().eval()
    fused = eqvit.fuse(model)
    assert isinstance(fused.posenc, KernelSO3RoPE) and type(model.posenc) is SO3RoPE
    # the lifting and unpatchify keep their turned kernels as buffers
    assert isinstance(fused.tokenizer, FrozenIcosphereLift) and isinstance(fused.head, FrozenIcosphereUnpatchify)
    x = model.domain.random_input(2, model.in_chans)
    with torch.no_grad():
        assert (fused(x) - model(x)).abs().max() <= 1e-12 * model(x).abs().max()
    assert_equivariant(fused, batch_size=1)
    assert eqvit.fuse(fused).posenc.kernel is fused.posenc.kernel  # fusing again keeps it
    assert copy.deepcopy(fused).posenc.kernel is KERNEL
    assert isinstance(pickle.loads(pickle.dumps(KERNEL)), SO3RotationKernel)


@needs_kernel
def test_a_kernel_with_a_wrong_block_fails_the_equivariance_check():
    fused = eqvit.fuse(randomise_(models.create_model("so3vit_tiny")).double())
    with torch.no_grad():  # swap two tokens' blocks: still rotations, no longer their poses'
        fused.posenc.wigner_blocks[[0, 1]] = fused.posenc.wigner_blocks[[1, 0]]
    with pytest.raises(EquivarianceError):
        assert_equivariant(fused, group=get_group("I"), batch_size=1)


def test_without_kernels_fuse_keeps_the_matmul(monkeypatch):
    monkeypatch.setenv("EQVIT_KERNELS", "0")
    assert kernels.load("so3_rotate") is None and SO3RotationKernel.load() is None
    fused = eqvit.fuse(models.create_model("so3vit_tiny"))
    assert type(fused.posenc) is SO3RoPE
    # folding needs no kernel; the factored passes do
    assert type(fused.tokenizer) is FrozenIcosphereLift and type(fused.head) is FrozenIcosphereUnpatchify


def test_a_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path):
    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    kernels._outcome.cache_clear()
    kernels._warn_once.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="cannot run the C\\+\\+ compiler"):
            assert kernels.load("so3_rotate") is None
        assert kernels.load("so3_rotate", warn=False) is None
        assert not list(tmp_path.glob("kernels/*.so"))
    finally:
        kernels._outcome.cache_clear()
        kernels._warn_once.cache_clear()


def test_a_compile_error_is_reported(monkeypatch, tmp_path):
    source = tmp_path / "broken.cpp"
    source.write_text("this is not C++\n")
    monkeypatch.setattr(kernels, "SOURCE_DIR", tmp_path)
    monkeypatch.setenv("EQVIT_CACHE", str(tmp_path / "cache"))
    if shutil.which(kernels._compiler()[0]) is None:
        pytest.skip("no C++ compiler here")
    with pytest.raises(kernels.KernelUnavailable, match=r"building broken\.cpp failed"):
        kernels._build_and_load("broken")
