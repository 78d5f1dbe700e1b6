"""Frame RoPE on the three layouts attention layers hold q and k in: token-major pairs, stacked q/k
inside a fused projection, and heads-major (timm's ``[2, B, H, N, D]`` after the qkv permute, used
by the fused frames-as-heads attention). The heads-major form must rotate exactly like the
token-major :meth:`rotate_qk_tokens` that the training layers use, prefix tokens untouched."""

from __future__ import annotations

import pytest
import torch

from eqvit.groups import get_group
from eqvit.nn.posenc.frame_rope import FrameRoPE


@pytest.mark.parametrize("bound", [False, True], ids=["fixed-positions", "bound-per-batch"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_heads_major_rotation_matches_the_reference(bound, prefix):
    group = get_group("D4")
    B, N, heads, D = 2, 5, 2, 6
    g = torch.Generator().manual_seed(0)
    positions = torch.randn(N - prefix, 2, generator=g, dtype=torch.float64)
    if bound:
        rope = FrameRoPE(group, heads, D).double().bind(positions.expand(B, -1, -1))
    else:
        rope = FrameRoPE(group, heads, D, positions=positions).double()
    GH = group.order * heads
    qk = torch.randn(2, B, GH, N, D, generator=g, dtype=torch.float64)
    q_ref, k_ref = (
        t.transpose(1, 2) for t in rope.rotate_qk_tokens(qk[0].transpose(1, 2), qk[1].transpose(1, 2), prefix)
    )
    rotated = rope.rotate_qk_heads_(qk.clone(), prefix)
    torch.testing.assert_close(rotated[0], q_ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(rotated[1], k_ref, rtol=0, atol=1e-14)
    assert not torch.allclose(rotated[:, :, :, prefix:], qk[:, :, :, prefix:])  # it does rotate
    torch.testing.assert_close(rotated[:, :, :, :prefix], qk[:, :, :, :prefix])  # prefix tokens stay


def test_heads_major_rotation_is_in_place_on_a_permuted_qkv_view():
    group = get_group("C4")
    B, N, heads, D = 1, 4, 1, 4
    rope = FrameRoPE(group, heads, D, positions=torch.randn(N, 2, dtype=torch.float64)).double()
    qkv = torch.randn(B, N, 3, group.order * heads, D, dtype=torch.float64).permute(2, 0, 3, 1, 4)
    before = qkv.clone()
    out = rope.rotate_qk_heads_(qkv[:2])
    assert out.data_ptr() == qkv.data_ptr()
    torch.testing.assert_close(qkv[2], before[2])  # v untouched
    q_ref = rope.rotate_qk_tokens(before[0].transpose(1, 2), before[1].transpose(1, 2))[0].transpose(1, 2)
    torch.testing.assert_close(qkv[0], q_ref)
