"""The DiP denoisers as registered models: sizes at equal width, the fused attention against the reference path,
adaLN-Zero's start as the identity, and what the builder refuses."""

from __future__ import annotations

import pytest
import torch
from helpers import randomise_

import eqvit
from eqvit.nn.adaln import AdaLNZeroBlock, FrameModulation, TimestepEmbedding


def test_registered_names_share_one_width():
    names = eqvit.list_models("dip_qm9_*")
    assert {"dip_qm9_tiny", "dip_qm9_trivial", "dip_qm9_T", "dip_qm9_O"} <= set(names)
    for name, order in (("dip_qm9_trivial", 1), ("dip_qm9_T", 12), ("dip_qm9_O", 24)):
        model = eqvit.create_model(name)
        assert model.embed_dim == eqvit.create_model("dip_qm9_T").embed_dim and model.frames.order == order
        assert model.out_chans == 3 + 5 and model.in_chans == 5
    # the trivial frames' heads are T's frames-as-heads: 12 heads of the same size
    trivial, tetra = eqvit.create_model("dip_qm9_trivial"), eqvit.create_model("dip_qm9_T")
    t_attn, e_attn = trivial.blocks[0].attn, tetra.blocks[0].attn
    assert t_attn.num_heads * t_attn.order == e_attn.num_heads * e_attn.order == 12
    assert t_attn.head_dim == e_attn.head_dim


def test_fused_attention_matches_the_reference_path():
    torch.manual_seed(0)
    fused = randomise_(eqvit.create_model("dip_qm9_tiny")).eval()
    reference = eqvit.create_model("dip_qm9_tiny", fused_attn=False).eval()
    reference.load_state_dict(fused.state_dict())
    x = fused.domain.random_input(2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    with torch.no_grad():
        a, b = fused(*x), reference(*x)
    assert a.abs().max() > 1e-2
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


def test_adaln_zero_blocks_start_as_the_identity_and_the_output_at_zero():
    model = eqvit.create_model("dip_qm9_tiny").eval()
    pos, feat, t = model.domain.random_input(2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    tokens = model.tokenizer(*model.input_encoding(pos, feat))
    cond = model.time_embed(t)
    with torch.no_grad():
        for block in model.blocks:
            assert isinstance(block, AdaLNZeroBlock)
            assert torch.equal(block(tokens, cond, model.posenc.rope_for(pos)), tokens)
        assert torch.equal(model(pos, feat, t), torch.zeros(2, 6, 8))


def test_modulation_is_one_value_per_channel_in_every_frame():
    mod = FrameModulation(group_order=3, channels=2, cond_dim=4, chunks=2)
    torch.nn.init.normal_(mod.linear.weight)
    shift, scale = mod(torch.randn(5, 4))
    assert shift.shape == scale.shape == (5, 1, 6)
    frames = shift.view(5, 3, 2)
    assert torch.equal(frames[:, 0], frames[:, 1]) and torch.equal(frames[:, 0], frames[:, 2])
    with pytest.raises(ValueError, match="6 chunks"):
        AdaLNZeroBlock(torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity(), torch.nn.Identity(), mod)


def test_time_embedding_tells_times_apart():
    embed = TimestepEmbedding(16)
    out = embed(torch.tensor([0.0, 0.001, 0.5, 1.0]))
    assert out.shape == (4, 16) and torch.isfinite(out).all()
    assert (torch.cdist(out, out) + torch.eye(4)).min() > 0
    with pytest.raises(ValueError, match="even freq_dim"):
        TimestepEmbedding(16, freq_dim=5)


def test_builder_refusals():
    with pytest.raises(ValueError, match=r"unknown attention \(dip\) 'sofmax'.*Did you mean 'softmax'"):
        eqvit.create_model("dip_qm9_tiny", attention="sofmax")
    with pytest.raises(ValueError, match="expected cond_dim to be a positive integer"):
        eqvit.create_model("dip_qm9_tiny", cond_dim=0)
    with pytest.raises(ValueError, match=r"denoiser.*no num_classes"):
        eqvit.create_model("dip_qm9_tiny", num_classes=3)
    with pytest.raises(ValueError, match="multiple of"):
        eqvit.create_model("dip_qm9_tiny", group="I")  # 48 channels do not split over 60 frames
    model = eqvit.create_model("dip_qm9_tiny")
    with pytest.raises(ValueError, match=r"expected t \[B\] with B = 2"):
        model(torch.zeros(2, 4, 3), torch.zeros(2, 4, 5), torch.zeros(3))
    with pytest.raises(ValueError, match=r"dtype float32 \(the model's parameter dtype\), got int64"):
        model(torch.zeros(2, 4, 3), torch.zeros(2, 4, 5), torch.zeros(2, dtype=torch.int64))
