"""Equivariant LayerNorm for irrep-wise features.

``x -> gamma * (x - m) / sqrt(mean(|x - m|^2) + eps) + beta``: the mean ``m`` is taken over the
trivial-irrep channels only (and subtracted from them), the scale is the invariant norm of the
whole token (all representation matrices are orthogonal), ``gamma`` is one scalar per irrep copy
(it commutes with rho) and ``beta`` lives on the trivial irrep only.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import DerivedCache


class IrrepLayerNorm(DerivedCache, ExactBuffers):
    """Equivariant LayerNorm on ``[..., ftype.dim]``.

    Args:
        ftype: the feature type.
        eps: added to the mean square.
        center: coordinates whose mean is subtracted (default: all trivial-irrep coordinates; a
            restricted model passes the image of its parent's trivial coordinates).
    """

    def __init__(self, ftype: FeatureType, eps: float = 1e-6, center: np.ndarray | None = None) -> None:
        super().__init__()
        self.ftype = ftype
        self.eps = eps
        center = ftype.trivial_index if center is None else np.asarray(center, dtype=np.int64)
        mask = np.zeros(ftype.dim)
        mask[center] = 1.0 / max(len(center), 1)
        self.register_exact_buffer("center_weights", torch.from_numpy(mask))
        self.register_exact_buffer("center_mask", torch.from_numpy((mask > 0).astype(np.float64)))
        # A contiguous centre (the default: the trivial irreps come first) is averaged as a slice.
        center = np.sort(center)
        contiguous = len(center) > 0 and np.array_equal(center, np.arange(center[0], center[0] + len(center)))
        self._center_slice = slice(int(center[0]), int(center[0]) + len(center)) if contiguous else None
        self.register_buffer("copy_index", torch.from_numpy(ftype.copy_index), persistent=False)
        self.register_buffer("bias_index", torch.from_numpy(ftype.trivial_index), persistent=False)
        self.weight = nn.Parameter(torch.ones(len(ftype.copies)))
        self.bias = nn.Parameter(torch.zeros(len(ftype.trivial_index)))

    def extra_repr(self) -> str:
        return f"{self.ftype}, eps={self.eps}"

    def affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gamma [dim], beta [dim])`` per coordinate (cached while no gradient is recorded)."""

        def compute():
            beta = self.bias.new_zeros(self.ftype.dim).index_add(0, self.bias_index, self.bias)
            return self.weight[self.copy_index], beta

        params = self._parameters
        return self.derived("affine", [params["weight"], params["bias"]], compute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._center_slice is not None:
            mean = x[..., self._center_slice].mean(-1, keepdim=True)
        else:
            mean = (x @ self.center_weights).unsqueeze(-1)
        x = torch.addcmul(x, mean, self.center_mask, value=-1)
        scale = x.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        gamma, beta = self.affine()
        return torch.addcmul(beta, x * scale, gamma)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        x = x - (x @ self.center_weights).unsqueeze(-1) * self.center_mask
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = x * self.weight[self.copy_index]
        return x.index_add(-1, self.bias_index, self.bias.expand(*x.shape[:-1], -1))
