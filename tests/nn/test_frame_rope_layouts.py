"""Frame RoPE on the three layouts attention layers hold q and k in: token-major pairs, stacked q/k
inside a stacked projection, and heads-major (timm's ``[2, B, H, N, D]`` after the qkv permute, used
by the folded frames-as-heads attention). The heads-major form must rotate exactly like the
token-major :meth:`rotate_qk_tokens` that the training layers use, prefix tokens untouched."""

from __future__ import annotations

import pytest
import torch

from eqvit.groups import get_group
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.posenc.frame_rope import FrameRoPE


def _rope(group, batch: int, tokens: int, heads: int, head_dim: int, prefix: int, bound: bool, generator):
    """A float64 frame RoPE on random positions of the tokens after the prefix: fixed, or bound per batch."""
    positions = torch.randn(tokens - prefix, 2, generator=generator, dtype=torch.float64)
    if bound:
        return FrameRoPE(group, heads, head_dim).double().bind(positions.expand(batch, -1, -1))
    return FrameRoPE(group, heads, head_dim, positions=positions).double()


@pytest.mark.parametrize("bound", [False, True], ids=["fixed-positions", "bound-per-batch"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_heads_major_rotation_matches_the_reference(bound, prefix):
    group = get_group("D4")
    B, N, heads, D = 2, 5, 2, 6
    g = torch.Generator().manual_seed(0)
    rope = _rope(group, B, N, heads, D, prefix, bound, g)
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


@pytest.mark.parametrize("bound", [False, True], ids=["fixed-positions", "bound-per-batch"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_frames_major_rotation_matches_the_reference(bound, prefix):
    """``[G, B, N, 2, H, D]`` (the Fourier-basis attention of eqvit.fold): in place, in one op, like the
    token-major reference; the generic fallback of the base class agrees too."""
    group = get_group("D4")
    G, B, N, heads, D = group.order, 2, 5, 2, 6
    g = torch.Generator().manual_seed(1)
    rope = _rope(group, B, N, heads, D, prefix, bound, g)
    frames = torch.randn(G, B, N, 3, heads, D, generator=g, dtype=torch.float64)
    tokens = frames.permute(1, 2, 3, 0, 4, 5).reshape(B, N, 3, G * heads, D)  # frame j's heads: j H .. j H + H - 1
    q_ref, k_ref = rope.rotate_qk_tokens(tokens[:, :, 0], tokens[:, :, 1], prefix)
    rotated = frames.clone()
    out = rope.rotate_qk_frames_(rotated[:, :, :, :2], prefix)
    assert out.data_ptr() == rotated.data_ptr()
    as_tokens = rotated.permute(1, 2, 3, 0, 4, 5).reshape(B, N, 3, G * heads, D)
    torch.testing.assert_close(as_tokens[:, :, 0], q_ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(as_tokens[:, :, 1], k_ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(rotated[:, :, :, 2], frames[:, :, :, 2])  # v untouched
    assert not torch.allclose(rotated[:, :, prefix:, :2], frames[:, :, prefix:, :2])  # it does rotate
    fallback = frames.clone()
    PositionalScheme.rotate_qk_frames_(rope, fallback[:, :, :, :2], prefix)  # through the token-major layout
    torch.testing.assert_close(fallback, rotated, rtol=0, atol=1e-14)
