"""Equivariant LayerNorm for irrep-wise features.

``x -> gamma * (x - m) / sqrt(mean(|x - m|^2) + eps) + beta``: the mean ``m`` is taken over the
trivial-irrep channels only (and subtracted from them), the scale is the invariant norm of the
whole token (all representation matrices are orthogonal), ``gamma`` is one scalar per irrep copy
(it commutes with rho) and ``beta`` lives on the trivial irrep only.

The forward pass is six ops: ``x @ (-mask / n)`` (a GEMV giving minus the centre mean as
``[..., 1]``; faster than a sum over a slice of the last axis), one ``addcmul`` for the centring,
then ``z / sqrt(mean z^2 + eps) = sqrt(dim) z / sqrt(|z|^2 + dim eps)`` as ``vector_norm`` + ``add`` + ``sqrt``
on one number per token, and ``div`` + ``addcmul(beta, z / den, gamma')`` with ``gamma' = sqrt(dim) gamma``.
``F.layer_norm`` cannot do it in one op on irrep-wise features: it subtracts the mean over all
channels, and the centred token ``z`` has no zero mean in general.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.autograd.function import once_differentiable

from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.stream import LayerNormCore, NormOutput, StreamBasis, StreamLayerNorm


def irrep_layer_norm(
    x: torch.Tensor,
    neg_center_col: torch.Tensor,
    mask: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    dim_eps: torch.Tensor,
) -> torch.Tensor:
    """The ops of :class:`IrrepLayerNorm` on ``x [..., dim]``, given its per-coordinate
    ``gamma' = sqrt(dim) gamma``, ``beta``, centre ``mask``, ``-mask / n`` column and ``dim eps``."""
    z = torch.addcmul(x, x @ neg_center_col, mask)
    return torch.addcmul(beta, z / _scale(z, dim_eps), gamma)


def _scale(z: torch.Tensor, dim_eps: torch.Tensor) -> torch.Tensor:
    """``sqrt(|z|^2 + dim eps)`` per token, ``[..., 1]`` (plain ops: they export to ONNX, unlike ``hypot``).
    ``vector_norm`` is one pass over ``z``; ``vecdot`` would multiply into a temporary of ``z``'s size first."""
    return torch.sqrt(torch.linalg.vector_norm(z, dim=-1, keepdim=True).square() + dim_eps)


class _IrrepLayerNorm(torch.autograd.Function):
    """:func:`irrep_layer_norm` with its backward written out: keeps the normalised token ``u = z / den`` and
    one number per token (the scale), where autograd would keep the centred token twice over, and works in
    place on its own temporaries (fewer passes over the tokens than autograd's)."""

    @staticmethod
    def forward(ctx, x, neg_center_col, mask, gamma, beta, dim_eps):
        z = torch.addcmul(x, x @ neg_center_col, mask)
        den = _scale(z, dim_eps)
        unit = z.div_(den)
        ctx.save_for_backward(unit, den, neg_center_col, mask, gamma)
        return torch.addcmul(beta, unit, gamma)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        # y = beta + gamma u, u = z / den, den = sqrt(|z|^2 + dim eps), z = x + (x @ n) mask (n = -centre weights):
        # dz = (g - u (u . g)) / den with g = gamma dy; dx = dz + (dz @ mask) n.
        unit, den, neg_center_col, mask, gamma = ctx.saved_tensors
        lead = tuple(range(grad.ndim - 1))
        grad_beta = grad.sum(lead) if ctx.needs_input_grad[4] else None
        # u . g = (dy * u) @ gamma: one pass over dy * u, which gamma's gradient sums too; then its buffer holds dz
        work = grad * unit
        grad_gamma = work.sum(lead) if ctx.needs_input_grad[3] else None
        u_dot_g = (work @ gamma).unsqueeze(-1)
        dz = torch.mul(grad, gamma, out=work).addcmul_(unit, u_dot_g, value=-1).div_(den)
        grad_x = dz.addcmul_(dz @ mask.unsqueeze(-1), neg_center_col.squeeze(-1))
        return grad_x, None, None, grad_gamma, grad_beta, None


class IrrepLayerNorm(ExactBuffers):
    """Equivariant LayerNorm on ``[..., ftype.dim]``.

    Args:
        ftype: the feature type.
        eps: added to the mean square.
        center: coordinates whose mean is subtracted (default: all trivial-irrep coordinates; a
            restricted model passes the image of its parent's trivial coordinates).
    """

    def __init__(self, ftype: FeatureType, eps: float = 1e-6, center: np.ndarray | None = None) -> None:
        super().__init__()
        self.in_type = self.out_type = ftype
        self.eps = eps
        center = ftype.trivial_index if center is None else np.asarray(center, dtype=np.int64)
        mask = np.zeros(ftype.dim)
        mask[center] = 1.0 / max(len(center), 1)
        self.register_exact_buffer("center_weights", torch.from_numpy(mask))
        self.register_exact_buffer("center_mask", torch.from_numpy((mask > 0).astype(np.float64)))
        # ``x @ neg_center_col`` is minus the centre mean as ``[..., 1]``.
        self.register_exact_buffer("neg_center_col", torch.from_numpy(-mask[:, None]))
        self.register_buffer("copy_index", torch.from_numpy(ftype.copy_index), persistent=False)
        self.register_buffer("bias_index", torch.from_numpy(ftype.trivial_index), persistent=False)
        self.weight = nn.Parameter(torch.ones(len(ftype.copies)))
        self.bias = nn.Parameter(torch.zeros(len(ftype.trivial_index)))

    @property
    def eps(self) -> float:
        return self._eps

    @eps.setter
    def eps(self, value: float) -> None:
        self._eps = float(value)

    def extra_repr(self) -> str:
        return f"{self.in_type}, eps={self.eps}"

    def affine(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(gamma [dim], beta [dim], centre mask [dim])`` per coordinate."""
        beta = self.bias.new_zeros(self.in_type.dim).index_add(0, self.bias_index, self.bias)
        return self.weight[self.copy_index], beta, self.center_mask

    def _scaled_affine(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`affine` with ``gamma * sqrt(dim)`` and the 0-d tensor ``dim eps``:
        ``z / sqrt(mean z^2 + eps) = sqrt(dim) z / sqrt(|z|^2 + dim eps)``."""
        gamma, beta, mask = self.affine()
        dim_eps = beta.new_tensor(self.in_type.dim * self.eps)
        return gamma * math.sqrt(self.in_type.dim), beta, mask, dim_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gamma, beta, mask, dim_eps = self._scaled_affine()
        # Its own backward: autograd would keep the centred token twice over (z, gamma z).
        if not torch.is_grad_enabled():
            return irrep_layer_norm(x, self._buffers["neg_center_col"], mask, gamma, beta, dim_eps)
        return _IrrepLayerNorm.apply(x, self._buffers["neg_center_col"], mask, gamma, beta, dim_eps)

    def fold(self) -> nn.Module:
        """The inference form: the per-coordinate affine fixed."""
        from eqvit.nn.folded import FoldedIrrepLayerNorm

        return FoldedIrrepLayerNorm(self)

    # ---------------------------------------------------------------- a folded model's stream (eqvit.nn.stream)
    def stream_basis(self) -> StreamBasis | None:
        """The change of basis of the stream under which this norm is ``F.layer_norm``: the reflection taking its
        centre direction to the uniform one (None without centre coordinates: ``F.layer_norm`` always centres)."""
        centre = self.exact_buffer("center_weights")
        if not centre.any():
            return None
        basis = StreamBasis.householder(centre, torch.ones_like(centre))
        return basis.to(self.weight.dtype)

    def _fits(self, basis: StreamBasis) -> bool:
        """Whether ``basis`` takes this norm's centre direction to the uniform one."""
        centre = self.exact_buffer("center_weights")
        if basis.dim != self.in_type.dim or not centre.any():
            return False
        mapped = (centre / centre.norm()) @ basis.matrix.double()
        return bool(torch.allclose(mapped, torch.full_like(mapped, basis.dim**-0.5), atol=1e-5))

    def split_in_stream(self, basis: StreamBasis) -> tuple[nn.Module, NormOutput] | None:
        """This norm on stream tokens ``y = x @ Q``: ``F.layer_norm(y)`` and its affine as a :class:`NormOutput` for
        the layer after it to fold in (``u @ Q^T diag(gamma) + beta``); None when ``basis`` does not fit the centre."""
        if not self._fits(basis):
            return None
        gamma, beta, _ = self.affine()
        q = basis.matrix.to(gamma.dtype)
        return LayerNormCore(self.in_type.dim, self.eps, gamma.dtype), NormOutput(q.T * gamma, beta)

    def fold_in_stream(self, basis: StreamBasis) -> nn.Module | None:
        """This norm on stream tokens, its output in the stream too (a model's final norm): ``F.layer_norm``, then
        the affine ``Q^T diag(gamma) Q`` and ``beta @ Q``; None when ``basis`` does not fit the centre."""
        split = self.split_in_stream(basis)
        if split is None:
            return None
        _, output = split
        weight, bias = basis.writing(output.matrix.T, output.shift)
        return StreamLayerNorm(self.in_type.dim, self.eps, weight, bias)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        gamma, beta, _ = self.affine()
        x = x - (x @ self.center_weights).unsqueeze(-1) * self.center_mask
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * gamma + beta
