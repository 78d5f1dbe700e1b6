"""The irrep-wise LayerNorm's written-out backward: autograd's gradients (float64, gradcheck), fewer saved tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import eqvit
from eqvit.groups import get_group
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.norm import IrrepLayerNorm, _IrrepLayerNorm, irrep_layer_norm


def _saved_bytes(fn, *inputs) -> int:
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def _norm() -> IrrepLayerNorm:
    model = eqvit.create_model("o2vit_d4_small_patch16_224", depth=1, img_size=32).double()
    return model.blocks[0].norm1


@pytest.mark.parametrize("layout", ["copies", "components"])
@pytest.mark.parametrize("center", [None, "first_two"])
def test_gradcheck(layout, center) -> None:
    """Every input: the token, the per-coordinate gamma and beta; the default centre (trivial irrep) and
    a restricted model's explicit one."""
    torch.manual_seed(2)
    ftype = FeatureType.regular(get_group("D4"), 2, layout=layout)
    norm = IrrepLayerNorm(ftype, eps=1e-3, center=None if center is None else np.array([0, 3])).double()
    x = torch.randn(2, 3, ftype.dim, dtype=torch.float64, requires_grad=True)
    gamma = torch.randn(ftype.dim, dtype=torch.float64, requires_grad=True)
    beta = torch.randn(ftype.dim, dtype=torch.float64, requires_grad=True)
    mask, root = norm.center_mask, torch.tensor(0.1, dtype=torch.float64)

    def fn(x, gamma, beta):
        return _IrrepLayerNorm.apply(x, norm.neg_center_col, mask, gamma, beta, root)

    assert torch.autograd.gradcheck(fn, (x, gamma, beta))
    reference = irrep_layer_norm(x, norm.neg_center_col, mask, gamma, beta, root)
    torch.testing.assert_close(fn(x, gamma, beta), reference, rtol=0, atol=0)


def test_norm_same_gradients_fewer_saved() -> None:
    torch.manual_seed(1)
    norm = _norm()
    with torch.no_grad():
        norm.weight.add_(0.3 * torch.randn_like(norm.weight))
        norm.bias.add_(0.3 * torch.randn_like(norm.bias))
    x = torch.randn(2, 64, norm.in_type.dim, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 64, norm.out_type.dim, dtype=torch.float64)
    params = [x, *norm.parameters()]

    def plain(x: torch.Tensor) -> torch.Tensor:
        gamma, beta, mask, root = norm._scaled_affine()
        return irrep_layer_norm(x, norm._buffers["neg_center_col"], mask, gamma, beta, root)

    got, want = torch.autograd.grad(norm(x), params, g), torch.autograd.grad(plain(x), params, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    token_bytes = x.numel() * x.element_size()
    affine_bytes = 8 * norm.in_type.dim * x.element_size()  # gamma, beta, mask, centre column, indices
    assert _saved_bytes(norm, x) <= token_bytes + affine_bytes  # x and the per-coordinate affine only
    assert _saved_bytes(plain, x) > 2 * token_bytes  # plain autograd keeps z and gamma z as well
