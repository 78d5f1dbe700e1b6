"""The inference form of a Platonic Transformer in the Fourier basis (issue 18, item 3).

For C copies of the regular representation a group convolution *is* a Schur irrep-wise linear in
the irrep basis (issue 17): ``sum_rho d_rho C'_rho C_rho`` multiply-adds per token instead of
``|G|^2 C' C`` (D4: 12 / 64). :func:`eqvit.fuse` therefore keeps the residual stream of a Platonic
model in the ``components`` layout of :func:`~eqvit.nn.activation.homogeneous_fourier_basis` with C
regular orbits (:func:`regular_basis`): coordinate ``s * C + c`` is Fourier coefficient s of channel
c, and the change of basis is ``T = Q (x) I_C`` with ``Q [|G|, |G|]`` orthogonal, one small matmul on
``[..., |G|, C]`` per token. ``T`` commutes with every per-channel operation, so

* the group convolutions become :class:`~eqvit.nn.fused_schur.FrozenSchurLinear` (``T^T W T`` loaded into an
  :class:`~eqvit.nn.linear.IrrepLinear`, exact by :meth:`~eqvit.nn.linear.IrrepLinear.load_dense_`);
* the frame-shared LayerNorm is an :class:`~eqvit.nn.norm.IrrepLayerNorm` (centre: the trivial
  coefficients; gamma: each copy its channel's; beta: ``T^T`` of the tiled bias), LayerScale is kept;
* the pointwise GELU on the frames is the strided :class:`~eqvit.nn.activation.FourierActivation`, and
  the MLP runs as :class:`~eqvit.nn.fused_schur.FourierSlabMlp` (hidden features in coefficient rows);
* frame RoPE and frames-as-heads read the frames: q, k, v go there with ``Q`` and the heads' output
  comes back with ``Q^T`` (:class:`FourierFrameAttention`), the only transforms of a block besides the
  GELU's;
* the lift's conv writes coefficients (``T`` folded into its output channels) and the head reads the
  token mean back on the frames (:class:`FramesReadout`).

The fused model computes the same function as the frame-basis one (tests check it in float64).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.nn.activation import FourierActivation, homogeneous_fourier_basis
from eqvit.nn.fused import FrozenIrrepLayerNorm
from eqvit.nn.fused_schur import (
    FourierSlabMlp,
    FrozenSchurLinear,
    frozen_rows_in,
    frozen_rows_out,
    register_rows_in,
    register_rows_out,
    run_frozen,
)
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.posenc.base import PositionalScheme


class RegularBasis:
    """C regular orbits in the Fourier basis: ``ftype`` (``components`` layout), the basis ``T
    [|G| C, dim]`` (frames, frame-major, -> coefficients: ``h = x @ T``) and ``Q [|G|, |G|]`` with
    ``T = Q (x) I_C`` (frames ``[..., |G|, C] = Q @ h.view(..., |G|, C)``), float64.
    ``basis`` is the :func:`homogeneous_fourier_basis` matrix (its rows channel-major), as a
    :class:`FourierActivation` on this type takes it."""

    def __init__(self, group: FiniteGroup, channels: int) -> None:
        G, C = group.order, channels
        self.ftype, self.basis, _ = homogeneous_fourier_basis(group, [("regular", C)], layout="components")
        rows = (np.arange(C)[None, :] * G + np.arange(G)[:, None]).reshape(-1)  # frame j, channel c -> c G + j
        self.transform = self.basis[rows]
        self.q = np.ascontiguousarray(self.basis[:G, ::C][:, :G])
        if not np.allclose(self.transform, np.kron(self.q, np.eye(C)), atol=1e-12):
            raise ValueError(f"the regular Fourier basis of {group.name} is not strided (Q (x) I_C)")


def schur_from_conv(conv: nn.Module, source: RegularBasis, target: RegularBasis) -> FrozenSchurLinear:
    """A group convolution (:class:`~eqvit.nn.regular.GroupConvLinear`) as fixed Schur block matmuls
    on Fourier coefficients: ``h -> h T_in^T W^T T_out + T_out^T b``."""
    weight, bias = conv.gather_dense()
    t_in, t_out = (torch.from_numpy(b.transform) for b in (source, target))
    w = t_out.T @ weight.detach().double().cpu() @ t_in
    b = None if bias is None else t_out.T @ bias.detach().double().cpu()
    lin = IrrepLinear(source.ftype, target.ftype, bias=bias is not None).to(weight.device, weight.dtype)
    lin.load_dense_(w, b)
    return FrozenSchurLinear(lin)


def irrep_norm_from_regular(norm: nn.Module, basis: RegularBasis) -> FrozenIrrepLayerNorm:
    """A frame-shared LayerNorm (:class:`~eqvit.nn.regular.RegularLayerNorm`) on the coefficients.

    The mean over all frames and channels is the mean of the trivial coefficients over ``sqrt|G|``,
    and ``T`` is orthogonal, so the centring and the scale are :class:`IrrepLayerNorm`'s; the per-channel
    ``gamma`` becomes each copy's channel's, the tiled bias ``T^T b`` lies on the trivial coefficients."""
    ftype, C = basis.ftype, norm.channels
    irrep = IrrepLayerNorm(ftype, eps=norm.eps).to(norm.weight.device, norm.weight.dtype)
    channel = torch.tensor([int(coords[0]) % C for _, _, coords in ftype.copies], device=norm.weight.device)
    beta = torch.from_numpy(basis.transform).T @ norm.bias.detach().double().cpu().repeat(norm.order)
    irrep.weight.copy_(norm.weight[channel])
    irrep.bias.copy_(beta[torch.from_numpy(ftype.trivial_index)])
    return FrozenIrrepLayerNorm(irrep)


def _fixed(matrix: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(matrix)).to(like.device, like.dtype)


class FourierFrameAttention(nn.Module):
    """Frames-as-heads attention (:class:`~eqvit.nn.platonic.PlatonicAttention`, ``scores="frames"``,
    no q/k-norm) on Fourier coefficients ``[B, N, |G| C] -> [B, N, |G| C]``.

    The Schur q/k/v runs write coefficient rows ``R [|G|, T, 3C]`` (row s: coefficient s of every
    channel, for all T tokens); one GEMM ``Q @ R`` puts them on the frames, where frame RoPE rotates q
    and k in place and SDPA reads them as ``[|G| B, H, N, D]`` views (frames and samples share the
    batch axis, no copy); the heads' output, ``[|G|, T, C]`` as SDPA lays it out, goes back with one GEMM
    ``Q^T @``, and the Schur projection runs read its rows. A slab of ``k`` rows (E of D4) is split into
    ``k`` matmuls of one row each (the q/k/v side) or accumulated over its ``k`` rows (the projection).
    """

    def __init__(self, attn: nn.Module, basis: RegularBasis) -> None:
        super().__init__()
        G, C = attn.order, attn.channels
        group = basis.ftype.group
        self.order, self.channels, self.num_heads, self.head_dim = G, C, attn.num_heads, attn.head_dim
        self.in_type = self.out_type = basis.ftype
        self.dim = G * C
        # The qkv convolution's output channel t C + c (q/k/v t) is C_out = 3C regular orbits.
        qkv = schur_from_conv(attn.qkv, basis, RegularBasis(group, 3 * C))
        proj = schur_from_conv(attn.proj, basis, basis)
        if qkv.zero_runs or proj.zero_runs:
            raise ValueError(f"expected every irrep of {group.name} in the regular Fourier basis, some are missing")
        like = proj.weight_0
        self.register_buffer("to_frames", _fixed(basis.q, like))
        self.register_buffer("from_frames", _fixed(basis.q.T, like))
        # q/k/v as coefficient rows of width 3C; the projection reads rows of width C.
        self.qkv_plan = register_rows_out(self, "qkv", qkv, 3 * C)
        self.proj_plans = register_rows_in(self, "proj", proj, C)
        self.sdpa = attn.sdpa

    def extra_repr(self) -> str:
        return f"frames={self.order}, heads per frame={self.num_heads}, head_dim={self.head_dim}"

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, |G| C] -> [B, N, |G| C]`` (Fourier coefficients)."""
        return run_frozen(self, self._forward, x, rope, num_prefix_tokens)

    def _forward(self, x: torch.Tensor, buffers: dict, rope: PositionalScheme | None, num_prefix_tokens: int):
        B, N, _ = x.shape
        G, C, H, D, T = self.order, self.channels, self.num_heads, self.head_dim, B * N
        flat = x.reshape(T, self.dim)
        rows = flat.new_empty(G, T, 3 * C)
        frozen_rows_out(self.qkv_plan, "qkv", buffers, flat, rows)
        frames = torch.mm(buffers["to_frames"], rows.view(G, -1)).view(G, B, N, 3, H, D)
        if rope is not None:  # frame RoPE on q and k in place (frames is this call's own tensor)
            rope.rotate_qk_frames_(frames[:, :, :, :2], num_prefix_tokens)
        q, k, v = (frames[:, :, :, i].transpose(2, 3).reshape(G * B, H, N, D) for i in range(3))
        heads = self.sdpa(q, k, v).transpose(1, 2).reshape(G, T * C)  # [G B, N, H, D] as SDPA lays it out
        back = torch.mm(buffers["from_frames"], heads).view(G, T, C)
        out = flat.new_empty(T, self.dim)
        frozen_rows_in(self.proj_plans, "proj", buffers, back, out)
        return out.view(B, N, self.dim)


def fourier_mlp(mlp: nn.Module, basis: RegularBasis) -> FourierSlabMlp:
    """A group-convolution MLP (:class:`~eqvit.nn.platonic.PlatonicMlp`) on Fourier coefficients:
    Schur fc1, the GELU on the hidden frames (the strided :class:`FourierActivation`), Schur fc2, run
    as :class:`~eqvit.nn.fused_schur.FourierSlabMlp` (hidden features in coefficient rows, in token chunks)."""
    hidden = RegularBasis(basis.ftype.group, mlp.fc1.out_channels)
    fc1 = schur_from_conv(mlp.fc1, basis, hidden)
    like = fc1.weight_0
    act = FourierActivation(hidden.ftype, hidden.basis, mlp.act).to(like.device, like.dtype)
    return FourierSlabMlp(fc1, act, schur_from_conv(mlp.fc2, hidden, basis))


class FramesReadout(nn.Module):
    """A frame-basis readout on Fourier-coefficient tokens: ``head(Q @ mean over tokens)``.

    ``tokens [B, N, |G| C]`` -> the token mean back on the frames ``[B, 1, |G| C]`` -> ``head``
    (:class:`~eqvit.nn.platonic.InvariantPoolHead`, which averages over tokens first: the mean
    commutes with ``Q``, so one token is transformed instead of N)."""

    def __init__(self, head: nn.Module, basis: RegularBasis, like: torch.Tensor) -> None:
        super().__init__()
        self.head = head
        self.order = basis.ftype.group.order
        self.register_buffer("to_frames", _fixed(basis.q, like))
        self.num_classes, self.num_features = head.num_classes, head.num_features

    def _frames(self, tokens: torch.Tensor) -> torch.Tensor:
        mean = tokens.mean(1, keepdim=True).unflatten(-1, (self.order, -1))  # [B, 1, G, C]
        return torch.matmul(self.to_frames, mean).flatten(-2)

    def pre_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, N, |G| C] -> [B, num_features]``."""
        return self.head.pre_logits(self._frames(tokens))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, N, |G| C] -> logits [B, num_classes]``."""
        return self.head(self._frames(tokens))


def fold_into_lift(lift: nn.Module, basis: RegularBasis) -> nn.Module:
    """A :class:`~eqvit.nn.fused.FrozenSquareLift` writing Fourier coefficients: ``T^T`` folded into
    its output channels (the conv's ``[|G| C, ...]`` rows, frame-major)."""
    t = _fixed(basis.transform.T, lift.weight)  # [dim, G C]
    lift.weight = (t @ lift.weight.flatten(1)).view_as(lift.weight).contiguous()
    lift.bias = t @ lift.bias
    return lift


def stream_cost_ratio(group: FiniteGroup) -> float:
    """Multiply-adds of a Schur linear on regular features relative to the dense group convolution.

    Irrep rho has ``m = d_rho / type_factor`` copies in one regular copy; its block costs ``d_rho m^2``
    for real type and ``(d_rho m)^2`` for the two-matrix form of the others; the sum is divided by
    ``|G|^2``. D4: 12 / 64, O: 64 / 576, I: 244 / 3600."""
    total = 0
    for rho in group.irreps:
        m = rho.dim // rho.type_factor
        total += (rho.dim * m * m) if rho.type == "real" else (rho.dim * m) ** 2
    return total / group.order**2
