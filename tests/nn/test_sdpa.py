"""The one attention kernel: SDPA and its written-out reference agree, dropout acts only in training."""

import pytest
import torch

from eqvit.nn.attention import Attention
from eqvit.nn.irrep_attention import IrrepAttention
from eqvit.nn.platonic import PlatonicAttention
from eqvit.nn.sdpa import ScaledDotProductAttention, reference_attention


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 8, 17, 6)])
def test_reference_matches_sdpa(shape):
    q, k, v = torch.randn(3, *shape, dtype=torch.float64).unbind(0)
    fused, reference = ScaledDotProductAttention(fused=True), ScaledDotProductAttention(fused=False)
    assert fused.fused and not reference.fused
    torch.testing.assert_close(reference(q, k, v), fused(q, k, v), rtol=1e-12, atol=1e-12)
    # The reference is softmax(q k^T / sqrt(D)) v, checked against a loop over one query.
    scores = (k[0, 0] @ q[0, 0, 0]) / shape[-1] ** 0.5
    torch.testing.assert_close(reference_attention(q, k, v)[0, 0, 0], scores.softmax(0) @ v[0, 0])


@pytest.mark.parametrize("fused", [True, False])
def test_dropout_only_in_training(fused):
    q, k, v = torch.randn(3, 2, 2, 16, 8).unbind(0)
    sdpa = ScaledDotProductAttention(dropout=0.5, fused=fused).eval()
    plain = ScaledDotProductAttention(fused=fused)
    torch.testing.assert_close(sdpa(q, k, v), plain(q, k, v))
    sdpa.train()
    assert not torch.allclose(sdpa(q, k, v), plain(q, k, v))


@pytest.mark.parametrize("rate", [-0.1, 1.0, 2.0])
def test_bad_dropout_rate(rate):
    with pytest.raises(ValueError, match=r"attention dropout rate in \[0, 1\)"):
        ScaledDotProductAttention(dropout=rate)


def test_every_attention_layout_uses_the_one_kernel():
    from eqvit.groups import get_group
    from eqvit.nn.irrep_attention import coupled_heads
    from eqvit.nn.irrep_features import FeatureType

    V = FeatureType.regular(get_group("C4"), 2)
    layers = [
        Attention(16, 2, attn_drop=0.1),
        IrrepAttention(V, coupled_heads(V, 2), attn_drop=0.1),
        PlatonicAttention(get_group("C4"), 8, 2, attn_drop=0.1),
    ]
    for layer in layers:
        kernels = [m for m in layer.modules() if isinstance(m, ScaledDotProductAttention)]
        assert len(kernels) == 1 and kernels[0].dropout == 0.1 and layer.fused
