"""SO(3)-RoPE (SO(3)-RoPE seed, Definition 1, eqs. 1-6, Theorem 2).

What is checked, and why each check can fail:

* Left-invariance of the scores: ``rope(q, gP) rope(k, gP)^T == rope(q, P) rope(k, P)^T``. This
  holds because ``pi(gU)^T pi(gV) = pi(U)^T pi(g)^T pi(g) pi(V) = pi(U^-1 V)`` (pi orthogonal and
  a homomorphism, eq. 1). The control test rotates the pose of ONE token only, which changes
  relative poses, and requires the scores to change: a rope that ignored the poses would pass
  the invariance test but fail that one.
* ``<rope(q, U), rope(k, V)> == q^T pi(U^-1 V) k`` (eq. 3) against ``rope.representation``.
* Norm preservation, pass-through channels, the fixed-pose buffer path, prefix tokens, exact
  buffers under ``.double()``, and ValueErrors for bad input.
"""

from __future__ import annotations

import pytest
import torch

from eqvit.groups.so3 import random_rotations, wigner_D_blocks
from eqvit.nn.posenc import SO3RoPE, max_order_for

# head_dim -> the largest L with (L+1)^2 <= head_dim.
HEAD_DIMS = [(16, 3), (32, 4), (64, 7)]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
B, H, N = 2, 2, 12


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _qk(head_dim: int, dtype: torch.dtype, seed: int = 0, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    q = torch.randn(B, H, n, head_dim, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, H, n, head_dim, generator=g, dtype=torch.float64).to(dtype)
    return q, k


def _scores(rope: SO3RoPE, q: torch.Tensor, k: torch.Tensor, poses: torch.Tensor) -> torch.Tensor:
    return rope(q, poses) @ rope(k, poses).transpose(-2, -1)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


# ------------------------------------------------------------------------------------------------
# relative-pose invariance of the attention scores


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("head_dim", [d for d, _ in HEAD_DIMS])
def test_scores_invariant_under_common_left_rotation(head_dim, dtype):
    rope = SO3RoPE(head_dim)
    q, k = _qk(head_dim, dtype)
    poses = random_rotations(N, generator=_gen(1)).to(dtype)
    g = random_rotations(1, generator=_gen(2)).to(dtype)
    before = _scores(rope, q, k, poses)
    after = _scores(rope, q, k, g @ poses)  # P -> g P for every token
    assert _rel(after, before) <= TOL[dtype]
    # Non-vacuous: the embedding really rotates (the scores are not those of plain q k^T).
    assert _rel(q @ k.transpose(-2, -1), before) > 1e-2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("head_dim", [d for d, _ in HEAD_DIMS])
def test_scores_invariant_with_batched_poses(head_dim, dtype):
    """Poses ``[B, N, 3, 3]`` (a different pose set per sample), each sample rotated by its own g."""
    rope = SO3RoPE(head_dim)
    q, k = _qk(head_dim, dtype, seed=3)
    poses = random_rotations(B * N, generator=_gen(4)).reshape(B, N, 3, 3).to(dtype)
    g = random_rotations(B, generator=_gen(5)).reshape(B, 1, 3, 3).to(dtype)
    before = _scores(rope, q, k, poses)
    after = _scores(rope, q, k, g @ poses)
    assert _rel(after, before) <= TOL[dtype]
    # The batched path uses each sample's own poses: sample 0's poses on sample 1 give other scores.
    swapped = _scores(rope, q, k, poses.flip(0))
    assert _rel(swapped, before) > 1e-2
    # ... and agrees with the unbatched path sample by sample.
    for b in range(B):
        single = _scores(rope, q[b : b + 1], k[b : b + 1], poses[b])
        assert _rel(single, before[b : b + 1]) <= TOL[dtype]


@pytest.mark.parametrize("head_dim", [d for d, _ in HEAD_DIMS])
def test_scores_change_when_relative_poses_change(head_dim):
    """Control: rotating ONE token's pose changes exactly that token's row and column."""
    rope = SO3RoPE(head_dim)
    q, k = _qk(head_dim, torch.float64, seed=6)
    poses = random_rotations(N, generator=_gen(7))
    moved = poses.clone()
    j = 4
    moved[j] = random_rotations(1, generator=_gen(8))[0] @ poses[j]
    before, after = _scores(rope, q, k, poses), _scores(rope, q, k, moved)
    diff = (after - before).abs()
    scale = before.abs().max()
    assert diff[..., j, :].max() / scale > 1e-2
    assert diff[..., :, j].max() / scale > 1e-2
    others = [i for i in range(N) if i != j]
    assert (diff[..., others, :][..., :, others].max() / scale).item() <= 1e-10


# ------------------------------------------------------------------------------------------------
# orthogonality and layout


@pytest.mark.parametrize(("head_dim", "L"), HEAD_DIMS + [(20, 3)])
def test_max_order_and_norm_preservation(head_dim, L):
    rope = SO3RoPE(head_dim)
    assert max_order_for(head_dim) == L
    assert rope.max_order == L and rope.rotated_dim == (L + 1) ** 2
    x, _ = _qk(head_dim, torch.float64, seed=9)
    poses = random_rotations(N, generator=_gen(10))
    out = rope(x, poses)
    assert out.shape == x.shape
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)


@pytest.mark.parametrize("head_dim", [16, 20, 32, 64])
def test_channels_beyond_rotated_pass_through(head_dim):
    rope = SO3RoPE(head_dim)
    r = rope.rotated_dim
    x, _ = _qk(head_dim, torch.float64, seed=11)
    out = rope(x, random_rotations(N, generator=_gen(12)))
    assert torch.equal(out[..., r:], x[..., r:])  # bit-exact pass-through (empty when r == head_dim)
    assert (out[..., 1:r] - x[..., 1:r]).abs().max() > 1e-2  # the rotated part does move
    assert torch.equal(out[..., 0], x[..., 0])  # D^0 = 1


def test_explicit_max_order_leaves_more_channels():
    rope = SO3RoPE(32, max_order=2)
    assert rope.rotated_dim == 9
    x, _ = _qk(32, torch.float64, seed=13)
    out = rope(x, random_rotations(N, generator=_gen(14)))
    assert torch.equal(out[..., 9:], x[..., 9:])


# ------------------------------------------------------------------------------------------------
# eq. 3: <rope(q, U), rope(k, V)> = q^T pi(U^-1 V) k


@pytest.mark.parametrize("head_dim", [16, 32])
def test_inner_product_is_relative_representation(head_dim):
    rope = SO3RoPE(head_dim)
    r = rope.rotated_dim
    q, k = _qk(head_dim, torch.float64, seed=15)
    U = random_rotations(N, generator=_gen(16))
    V = random_rotations(N, generator=_gen(17))
    lhs = (rope(q, U) * rope(k, V)).sum(-1)  # [B, H, N]: token n's q at U_n with token n's k at V_n
    rel = rope.representation(U.transpose(-2, -1) @ V)  # pi(U^-1 V), [N, r, r]
    assert rel.shape == (N, r, r)
    rhs = torch.einsum("bhni,nij,bhnj->bhn", q[..., :r], rel, k[..., :r]) + (q[..., r:] * k[..., r:]).sum(-1)
    assert _rel(lhs, rhs) <= 1e-12
    # pi is the block-diagonal D^0 + ... + D^L of eq. 6.
    torch.testing.assert_close(rope.representation(U), wigner_D_blocks(rope.max_order, U), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# the fixed-pose buffer path used inside attention


def test_rotate_qk_buffer_equals_forward():
    head_dim = 32
    poses = random_rotations(N, generator=_gen(18))
    rope = SO3RoPE(head_dim, poses=poses)  # buffer in the default dtype (float32)
    q, k = _qk(head_dim, torch.float32, seed=19)
    q2, k2 = rope.rotate_qk(q, k)
    torch.testing.assert_close(q2, rope(q, poses))
    torch.testing.assert_close(k2, rope(k, poses))
    assert (q2 - q).abs().max() > 1e-2


def test_rotate_qk_skips_prefix_tokens():
    head_dim = 16
    poses = random_rotations(N, generator=_gen(20))
    rope = SO3RoPE(head_dim, poses=poses).double()
    q, k = _qk(head_dim, torch.float64, seed=21, n=N + 1)
    q2, k2 = rope.rotate_qk(q, k, num_prefix_tokens=1)
    assert torch.equal(q2[..., :1, :], q[..., :1, :])
    assert torch.equal(k2[..., :1, :], k[..., :1, :])
    torch.testing.assert_close(q2[..., 1:, :], rope(q[..., 1:, :], poses), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(k2[..., 1:, :], rope(k[..., 1:, :], poses), rtol=1e-14, atol=1e-14)


def test_double_keeps_buffer_exact():
    L = max_order_for(64)
    poses = random_rotations(N, generator=_gen(22))
    exact = wigner_D_blocks(L, poses)  # float64 computation
    rope = SO3RoPE(64, poses=poses)
    assert rope.pi.dtype == torch.get_default_dtype()
    # Control: a float32 buffer merely cast to float64 is off by float32 round-off.
    assert (rope.pi.double() - exact).abs().max() > 1e-10
    rope = rope.double()
    assert rope.pi.dtype == torch.float64
    assert (rope.pi - exact).abs().max() <= 1e-14
    # A float round trip does not lose it either.
    rope = rope.float().double()
    assert (rope.pi - exact).abs().max() <= 1e-14
    # And the buffer path then equals the float64 computation.
    q, k = _qk(64, torch.float64, seed=23)
    q2, _ = rope.rotate_qk(q, k)
    expected = torch.einsum("nij,bhnj->bhni", exact, q)
    assert (q2 - expected).abs().max() <= 1e-14 * q.abs().max() * 64


# ------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("shape", [(N, 3), (N, 3, 4), (N, 9), (3, 3), (1, 2, N, 3, 3)])
def test_bad_pose_shapes(shape):
    rope = SO3RoPE(16)
    x, _ = _qk(16, torch.float64)
    with pytest.raises(ValueError, match="poses"):
        rope(x, torch.zeros(shape, dtype=torch.float64))
    with pytest.raises(ValueError, match="poses"):
        SO3RoPE(16, poses=torch.zeros(shape))


def test_wrong_token_count():
    rope = SO3RoPE(16)
    x, _ = _qk(16, torch.float64)
    with pytest.raises(ValueError, match=f"{N + 1} poses for {N} tokens"):
        rope(x, random_rotations(N + 1, generator=_gen()))
    fixed = SO3RoPE(16, poses=random_rotations(N, generator=_gen()))
    q, k = _qk(16, torch.float32, n=N + 2)
    with pytest.raises(ValueError, match=f"expected {N} tokens"):
        fixed.rotate_qk(q, k)
    with pytest.raises(ValueError, match=f"expected {N} tokens after 1 prefix"):
        fixed.rotate_qk(q, k, num_prefix_tokens=1)


def test_head_dim_mismatch():
    rope = SO3RoPE(16)
    x, _ = _qk(17, torch.float64)
    with pytest.raises(ValueError, match="head_dim 16"):
        rope(x, random_rotations(N, generator=_gen()))


def test_bad_construction():
    with pytest.raises(ValueError, match="max_order"):
        SO3RoPE(16, max_order=4)  # needs 25 channels
    with pytest.raises(ValueError, match="max_order"):
        SO3RoPE(16, max_order=-1)
    with pytest.raises(ValueError, match="head_dim"):
        SO3RoPE(0)
    with pytest.raises(ValueError, match="without fixed poses"):
        SO3RoPE(16).rotate_qk(*_qk(16, torch.float32))


@pytest.mark.parametrize("head_dim", [16, 30, 64])
@pytest.mark.parametrize("prefix", [0, 1])
def test_token_major_fast_path_equals_rotate_qk(head_dim, prefix):
    """Attention calls rotate_qk_tokens on [B, N, H, D]; it must equal rotate_qk on [B, H, N, D]."""
    from eqvit.groups.so3 import random_rotations

    gen = torch.Generator().manual_seed(3)
    poses = random_rotations(7, generator=gen, dtype=torch.float64)
    rope = SO3RoPE(head_dim, poses=poses).double()
    q = torch.randn(2, 7 + prefix, 3, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 7 + prefix, 3, head_dim, generator=gen, dtype=torch.float64)
    fast_q, fast_k = rope.rotate_qk_tokens(q, k, prefix)
    ref_q, ref_k = rope.rotate_qk(q.transpose(1, 2), k.transpose(1, 2), prefix)
    assert torch.allclose(fast_q, ref_q.transpose(1, 2), atol=1e-13)
    assert torch.allclose(fast_k, ref_k.transpose(1, 2), atol=1e-13)
    assert not torch.allclose(fast_q, q)  # it does rotate


@pytest.mark.parametrize("head_dim", [4, 16, 30])
@pytest.mark.parametrize("prefix", [0, 1])
def test_stacked_in_place_on_qkv_view_equals_rotate_qk(head_dim, prefix):
    """Attention rotates q and k in place in its qkv output ``[B, N, 3, H, D]``; that must equal
    rotate_qk (float64, 1e-13), touch neither v nor the prefix tokens, and back-propagate the same."""
    gen = torch.Generator().manual_seed(4)
    poses = random_rotations(7, generator=gen, dtype=torch.float64)
    rope = SO3RoPE(head_dim, poses=poses).double()
    source = torch.randn(2, 7 + prefix, 3 * 3 * head_dim, generator=gen, dtype=torch.float64, requires_grad=True)
    qkv = (source * 1.0).view(2, 7 + prefix, 3, 3, head_dim)  # a fresh projection's output, viewed
    out = rope.rotate_qk_stacked_(qkv[:, :, :2], prefix)
    assert out.data_ptr() == qkv.data_ptr()  # in place, in the qkv tensor itself
    ref = source.detach().view(2, 7 + prefix, 3, 3, head_dim)
    ref_q, ref_k = rope.rotate_qk(ref[:, :, 0].transpose(1, 2), ref[:, :, 1].transpose(1, 2), prefix)
    assert (qkv[:, :, 0] - ref_q.transpose(1, 2)).abs().max() <= 1e-13
    assert (qkv[:, :, 1] - ref_k.transpose(1, 2)).abs().max() <= 1e-13
    assert torch.equal(qkv[:, :, 2], ref[:, :, 2])  # v untouched
    assert torch.equal(qkv[:, :prefix], ref[:, :prefix])
    assert not torch.allclose(qkv[:, prefix:, :2], ref[:, prefix:, :2])  # it does rotate
    # Gradients through the in-place write equal those of the out-of-place reference.
    weight = torch.randn(qkv.shape, generator=gen, dtype=torch.float64)
    (grad,) = torch.autograd.grad((qkv * weight).sum(), source)
    src = source.detach().clone().requires_grad_(True)
    view = src.view(2, 7 + prefix, 3, 3, head_dim)
    q2, k2 = rope.rotate_qk(view[:, :, 0].transpose(1, 2), view[:, :, 1].transpose(1, 2), prefix)
    expected = torch.stack([q2.transpose(1, 2), k2.transpose(1, 2), view[:, :, 2]], dim=2)
    (grad_ref,) = torch.autograd.grad((expected * weight).sum(), src)
    assert (grad - grad_ref).abs().max() <= 1e-13


def test_stacked_in_place_order_zero_is_the_identity():
    """L = 0 rotates nothing (pi = D^0 = 1); the in-place path returns its input untouched."""
    rope = SO3RoPE(3, poses=random_rotations(N, generator=_gen(6)))
    assert rope.max_order == 0
    qk = torch.randn(B, N, 2, H, 3)
    before = qk.clone()
    assert rope.rotate_qk_stacked_(qk) is qk
    assert torch.equal(qk, before)


def test_stacked_in_place_needs_a_view():
    """q and k heads that cannot be merged without a copy are refused (a copy would drop the write)."""
    rope = SO3RoPE(16, poses=random_rotations(N, generator=_gen(5)))
    qk = torch.randn(B, N, H, 2, 16).transpose(2, 3)  # [B, N, 2, H, D] with the q/k axis inside the heads
    with pytest.raises(RuntimeError, match="view"):
        rope.rotate_qk_stacked_(qk)
    with pytest.raises(ValueError, match=f"expected {N} tokens"):
        rope.rotate_qk_stacked_(torch.randn(B, N + 1, 2, H, 16))
