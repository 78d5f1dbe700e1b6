"""Recompute-in-backward (eqvit.nn.recompute): the same gradients as plain autograd, fewer saved tensors."""

from __future__ import annotations

import torch

import eqvit
from eqvit.nn.norm import IrrepLayerNorm, irrep_layer_norm
from eqvit.nn.recompute import recompute


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


def test_recompute_matches_autograd_and_gradcheck() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a * b).exp()

    assert torch.autograd.gradcheck(lambda a, b: recompute(fn, a, b), (x, w))
    with torch.no_grad():  # a plain call: nothing is recorded
        assert recompute(fn, x, w).grad_fn is None


def test_norm_recompute_same_gradients_fewer_saved() -> None:
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
