"""A folded model's residual stream kept in another orthonormal basis, so that its norms are ``F.layer_norm``.

The equivariant LayerNorm (:class:`~eqvit.nn.norm.IrrepLayerNorm`) removes the component of a token along the
mean direction ``e`` of the trivial-irrep coordinates; ``F.layer_norm`` removes the component along the uniform
direction ``f = 1 / sqrt(d)``. Both then divide by the token's RMS, which an orthogonal change of basis keeps.
So with the tokens kept as ``y = x @ Q`` for an orthogonal ``Q`` with ``e @ Q = f`` (the Householder reflection
of :meth:`StreamBasis.householder`) the norm is ``F.layer_norm(y)`` followed by its affine. The affine (one
scale per irrep copy, a bias on the trivial coordinates) is not diagonal in the new basis: it folds into the
dense layer that reads the norm (:class:`NormOutput`), as the basis folds into every dense layer that reads or
writes the stream.

:meth:`EquivariantViT.fold <eqvit.models.vit.EquivariantViT.fold>` does this when every layer on the stream can
(``fold_in_stream``); what leaves the stream (the readout, intermediate maps) is mapped back (:class:`FromStream`),
so the folded model has the public interface of the unfolded one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class StreamBasis(nn.Module):
    """An orthogonal change of basis ``Q [d, d]`` of a residual stream: a token ``x [..., d]`` is kept as ``x @ Q``.

    :meth:`writing` turns a dense layer ``F.linear(x, weight, bias)`` whose output goes into the stream; a layer
    reading the stream after a norm folds the norm's :class:`NormOutput` instead.
    """

    def __init__(self, matrix: torch.Tensor) -> None:
        super().__init__()
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"expected a square change of basis [d, d], got shape {tuple(matrix.shape)}")
        self.register_buffer("matrix", matrix.detach().clone())

    @classmethod
    def householder(cls, source: torch.Tensor, target: torch.Tensor) -> StreamBasis:
        """The reflection ``Q = I - 2 v v^T / |v|^2``, ``v = s - t``, that maps the direction of ``source [d]`` to
        that of ``target [d]`` (``s``, ``t`` the unit vectors); the identity when they coincide."""
        s = source.double() / source.double().norm()
        t = target.double() / target.double().norm()
        v = s - t
        eye = torch.eye(len(s), dtype=torch.float64)
        length2 = v @ v
        matrix = eye if length2 < 1e-24 else eye - 2.0 * torch.outer(v, v) / length2
        return cls(matrix.to(source.dtype))

    @property
    def dim(self) -> int:
        return self.matrix.shape[0]

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

    def to_stream(self, x: torch.Tensor) -> torch.Tensor:
        """Nominal vectors ``x [..., d]`` (weights, biases, tokens) in the stream basis."""
        return x @ self.matrix.to(x.dtype)

    def writing(self, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight [d, in], bias [d])`` of a layer writing the stream, made to write it in this basis."""
        q = self.matrix.to(weight.dtype)
        return q.T @ weight, None if bias is None else bias @ q


class NormOutput:
    """What a folded norm hands the layer after it: ``u [..., d]`` standing for the norm's output
    ``u @ matrix + shift``.

    The layer folds it into its weights (:meth:`reading`), so the norm itself is a bare ``F.layer_norm``.
    """

    def __init__(self, matrix: torch.Tensor, shift: torch.Tensor | None) -> None:
        self.matrix, self.shift = matrix, shift

    def reading(self, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight [out, d], bias [out])`` of a layer reading the norm's output, made to read ``u``."""
        folded = weight @ self.matrix.to(weight.dtype).T
        if self.shift is None:
            return folded, bias
        shifted = weight @ self.shift.to(weight.dtype)
        return folded, shifted if bias is None else bias + shifted


class LayerNormCore(nn.Module):
    """``F.layer_norm`` over the last axis without an affine (the layer after it holds that):
    ``[..., d] -> [..., d]``."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.dim, self.eps = dim, float(eps)
        # A unit weight rather than none: ATen's CPU kernel without a weight is about 2x slower
        # (27 against 15 us on [1, 257, 48], torch 2.14).
        self.register_buffer("unit", torch.ones(dim, dtype=dtype), persistent=False)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), self.unit, None, self.eps)


class StreamLayerNorm(LayerNormCore):
    """A norm on the stream that hands its output back to the stream (the model's final norm): ``F.layer_norm``,
    then its affine in the stream basis, a dense ``[d, d]`` map and a bias."""

    def __init__(self, dim: int, eps: float, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(dim, eps, weight.dtype)
        self.register_buffer("weight", weight.detach().clone().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(super().forward(x), self.weight, self.bias)  # [..., d] -> [..., d]


class FromStream(nn.Module):
    """``module`` reading the stream in ``basis``: the tokens mapped back to the nominal basis first,
    ``y [..., d] -> module(y @ Q^T)`` (the readout and the intermediate maps of a folded model)."""

    def __init__(self, module: nn.Module, basis: StreamBasis) -> None:
        super().__init__()
        self.module, self.basis = module, basis

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.module(F.linear(y, self.basis.matrix))
