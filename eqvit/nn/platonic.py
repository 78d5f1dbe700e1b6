"""Platonic Transformer blocks on regular features ``[B, N, |G| * C]`` (Platonic Transformer seed).

The computation graph is a standard ViT's at width ``|G| * C``: group-convolution linears
(:class:`~eqvit.nn.regular.GroupConvLinear`) replace the dense ones, frames become extra heads
of SDPA, and norms / LayerScale share their parameters across frames.

Every block comes in two bases of the same features (``basis``): on the frames, as the seed writes it, or
on their Fourier coefficients (:class:`~eqvit.nn.regular.RegularBasis`), where the group convolutions are
Schur block matmuls (12/64 of the dense multiply-adds for D4) and the frames are visited only where a layer
acts per frame: frame RoPE and the attention scores (:class:`FourierPlatonicAttention`) and the pointwise
GELU (the Fourier MLP's coefficient rows). Both have the same parameters: with one state dict they compute
the same function.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.nn.activation import FourierActivation
from eqvit.nn.attention import qk_norms
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.init import vit_linear
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Block, FeatureGather, check_num_classes
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.regular import FourierLayerNorm, GroupConvLinear, RegularBasis, RegularLayerNorm, RegularLayerScale
from eqvit.nn.rows_mlp import activation_kind, rows_mlp, rows_mlp_lean, transformed_rows_in
from eqvit.nn.schur import rows_out
from eqvit.nn.sdpa import ScaledDotProductAttention

SCORES = ("frames", "invariant")
FRAME_POOLS = ("mean", "max")
BASES = ("frames", "fourier")


# Token-major heads [B, N, G, H, D] <-> SDPA's [batch, heads, N, head_dim] for the two score layouts.
def _frames_scores(q, k, v, sdpa):
    """Frames as heads: ``[B, N, G H, D]`` each -> ``[B, N, G H D]``."""
    B, N, GH, D = q.shape
    out = sdpa(*(t.transpose(1, 2) for t in (q, k, v)))  # [B, G H, N, D]
    return out.transpose(1, 2).reshape(B, N, GH * D)


def _invariant_scores(q, k, v, sdpa, G):
    """Heads over all frames (seed eq. 13): ``[B, N, G H, D]`` each -> ``[B, N, G H D]``."""
    B, N, GH, D = q.shape
    H = GH // G
    out = sdpa(*(t.reshape(B, N, G, H, D).permute(0, 3, 1, 2, 4).reshape(B, H, N, G * D) for t in (q, k, v)))
    return out.reshape(B, H, N, G, D).permute(0, 2, 3, 1, 4).reshape(B, N, GH * D)


class FrameAttention(ExactBuffers):
    """What the frames-as-heads attentions share: ``C`` channels per frame in ``H`` heads of ``D = C / H``, the
    score layout (``scores``), SDPA, the optional qk-norms and the output dropout. The subclasses add the
    projections (on the frames or on their Fourier coefficients) and the forward."""

    def __init__(self, group: FiniteGroup, channels: int, num_heads: int, attn_drop: float, fused: bool, scores: str):
        super().__init__()
        _check_heads(channels, num_heads, scores)
        self.order, self.channels, self.num_heads = group.order, channels, num_heads
        self.head_dim = channels // num_heads
        self.scores = scores
        self.sdpa = ScaledDotProductAttention(attn_drop, fused)

    @property
    def fused(self) -> bool:
        return self.sdpa.fused


class FrameProjectedAttention(FrameAttention):
    """Frames-as-heads attention whose projections are group convolutions on the frames: one for the ``parts``
    (q, k, v; or q, v when the keys are fixed) and one for the output. The projection's output is reordered
    (``head_order``, folded into its rows by :meth:`fold`) from frames-major ``(G, parts, H, D)`` to
    ``(parts, G, H, D)``: each part is then a plain view, as in timm. The subclasses add the forward.
    """

    def __init__(
        self,
        group: FiniteGroup,
        channels: int,
        num_heads: int,
        parts: int,
        qkv_bias: bool,
        attn_drop: float,
        proj_drop: float,
        fused: bool,
        scores: str,
        impl: str,
    ) -> None:
        super().__init__(group, channels, num_heads, attn_drop, fused, scores)
        self.in_type = self.out_type = FeatureType.frames(group, channels)
        self.qkv = GroupConvLinear(group, channels, parts * channels, bias=qkv_bias, impl=impl)
        self.proj = GroupConvLinear(group, channels, channels, impl=impl)
        self.proj_drop = nn.Dropout(proj_drop)
        # Row r of the output in (part, frame, channel) order reads row (frame, part, channel).
        rows = torch.arange(parts * group.order * channels).view(group.order, parts, channels).transpose(0, 1)
        self.head_order = FeatureGather(rows.flatten())
        self.parts = parts
        self._attend = _frames_scores if scores == "frames" else _invariant_scores
        self._score_args = () if scores == "frames" else (group.order,)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, N, |G| C] -> [B, N, parts, |G| H, D]``: the parts with frames-major heads."""
        out = self.head_order(self.qkv(x))
        return out.unflatten(-1, (self.parts, self.order * self.num_heads, self.head_dim))

    def fold(self) -> nn.Module:
        """The inference form: with a dense (``"cayley"``) projection, the head order folded into its rows; the
        linears then fold themselves."""
        if not (isinstance(self.head_order, FeatureGather) and getattr(self.qkv, "impl", None) == "cayley"):
            return self
        from eqvit.nn.folded import FoldedLinear

        weight, bias = self.qkv.gather_dense()
        index = self.head_order.index
        folded = copy.deepcopy(self)
        folded.qkv = FoldedLinear(weight[index], None if bias is None else bias[index], out_type=self.qkv.out_type)
        folded.head_order = nn.Identity()
        return folded


class PlatonicAttention(FrameProjectedAttention):
    """Self-attention on regular features with frames as heads.

    Per frame, ``C`` channels split into ``H`` heads of ``D = C / H``. ``scores="frames"`` (the
    seed's default) runs ``|G| * H`` independent heads ``[B, |G| H, N, D]``, one attention pattern
    per frame; ``scores="invariant"`` (seed eq. 13) merges frames into the head channels,
    ``[B, H, N, |G| D]``, so each score sums the frames' scores before the softmax and one pattern
    is shared by all frames. Rotary schemes (frame RoPE) rotate ``q, k`` stacked, ``[B, N, 2, |G| H, D]``,
    in place; q, k and v are views of the reordered projection (:class:`FrameProjectedAttention`).

    Args:
        group: the frames G.
        channels: C per frame.
        num_heads: H per frame.
        qkv_bias, qk_norm: as in timm (qk-norm is a LayerNorm over D, shared across frames and heads).
        attn_drop, proj_drop: dropout rates.
        fused: SDPA (True) or the explicit softmax reference path (False).
        scores: ``"frames"`` or ``"invariant"``.
        impl: :class:`GroupConvLinear` implementation.
    """

    def __init__(
        self,
        group: FiniteGroup,
        channels: int,
        num_heads: int,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused: bool = True,
        scores: str = "frames",
        impl: str = "auto",
    ) -> None:
        super().__init__(group, channels, num_heads, 3, qkv_bias, attn_drop, proj_drop, fused, scores, impl)
        self.q_norm, self.k_norm, self._stack_qk = qk_norms(self.head_dim, qk_norm)  # shared over frames, heads

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, |G| C] -> [B, N, |G| C]``."""
        qkv = self.project_qkv(x)  # [B, N, 3, G H, D]
        qk = self._stack_qk(qkv, self.q_norm, self.k_norm, 2)
        if rope is not None:  # in place: qkv is this layer's own fresh projection
            qk = rope.rotate_qk_stacked_(qk, num_prefix_tokens)
        out = self._attend(*qk.unbind(2), qkv[:, :, 2], self.sdpa, *self._score_args)
        return self.proj_drop(self.proj(out))


def _check_heads(channels: int, num_heads: int, scores: str) -> None:
    if channels % num_heads:
        raise ValueError(f"channels per frame {channels} must be divisible by num_heads {num_heads}")
    if scores not in SCORES:
        raise ValueError(f"unknown scores {scores!r}; valid: {', '.join(SCORES)}")


# Frames-major heads [G, B, N, H, D] (the Fourier basis' layout) <-> SDPA.
def _frames_scores_by_frame(q, k, v, sdpa):
    """Frames as heads: ``[G, B, N, H, D]`` each -> ``[G, B, N, H, D]``, frames and samples one batch axis."""
    G, B, N, H, D = q.shape
    out = sdpa(*(t.transpose(2, 3).reshape(G * B, H, N, D) for t in (q, k, v)))  # views: no copies
    return out.view(G, B, H, N, D).transpose(2, 3)


def _invariant_scores_by_frame(q, k, v, sdpa):
    """Heads over all frames: ``[G, B, N, H, D]`` each -> ``[G, B, N, H, D]``."""
    G, B, N, H, D = q.shape
    out = sdpa(*(t.permute(1, 3, 2, 0, 4).reshape(B, H, N, G * D) for t in (q, k, v)))
    return out.view(B, H, N, G, D).permute(3, 0, 2, 1, 4)


class FourierPlatonicAttention(FrameAttention):
    """:class:`PlatonicAttention` on Fourier coefficients (:class:`~eqvit.nn.regular.RegularBasis`):
    ``[B, N, |G| C] -> [B, N, |G| C]``, the same parameters and function.

    The qkv group convolution writes coefficient rows ``[|G|, T, 3 C]`` (row s: coefficient s of every
    channel, for all T tokens; :func:`~eqvit.nn.schur.rows_out`); one GEMM ``Q @`` puts them on the frames
    ``[|G|, B, N, 3, H, D]``, where frame RoPE rotates q and k in place and SDPA reads the heads (frames and
    samples share its batch axis for ``scores="frames"``); one GEMM ``Q^T @`` takes the heads' output back to
    rows, which the projection reads (:func:`~eqvit.nn.schur.rows_in`). The change of basis costs
    ``|G|^2`` multiply-adds per channel each way, the Schur linears ``sum_rho d_rho m_rho^2`` per channel pair.

    Args: as :class:`PlatonicAttention` (``impl`` does not apply).
    """

    def __init__(
        self,
        group: FiniteGroup,
        channels: int,
        num_heads: int,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused: bool = True,
        scores: str = "frames",
    ) -> None:
        super().__init__(group, channels, num_heads, attn_drop, fused, scores)
        basis = RegularBasis(group, channels)
        self.in_type = self.out_type = basis.ftype
        self.qkv = GroupConvLinear(group, channels, 3 * channels, bias=qkv_bias, basis="fourier")
        self.q_norm, self.k_norm, self._stack_qk = qk_norms(self.head_dim, qk_norm)  # shared over frames, heads
        self.proj = GroupConvLinear(group, channels, channels, basis="fourier")
        self.proj_drop = nn.Dropout(proj_drop)
        self.register_exact_buffer("to_frames", torch.from_numpy(np.array(basis.q)))
        self.register_exact_buffer("from_frames", torch.from_numpy(np.ascontiguousarray(basis.q.T)))
        self._attend = _frames_scores_by_frame if scores == "frames" else _invariant_scores_by_frame

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, |G| C] -> [B, N, |G| C]`` (Fourier coefficients)."""
        B, N, dim = x.shape
        G, C, H, D = self.order, self.channels, self.num_heads, self.head_dim
        qkv, proj, buffers = self.qkv, self.proj, self._buffers
        rows = rows_out(x.reshape(B * N, dim), qkv.plan, *qkv.slab_weights(), 3 * C)  # [G, T, 3C]
        frames = torch.mm(buffers["to_frames"], rows.flatten(1)).view(G, B, N, 3, H, D)
        qk = self._stack_qk(frames, self.q_norm, self.k_norm, 3)
        if rope is not None:  # in place: frames is this call's own tensor
            qk = rope.rotate_qk_frames_(qk, num_prefix_tokens)
        heads = self._attend(qk[:, :, :, 0], qk[:, :, :, 1], frames[:, :, :, 2], self.sdpa)  # [G, B, N, H, D]
        # Back to rows and the projection, keeping only the heads (SDPA's own output) for backward.
        out = transformed_rows_in(heads.reshape(G, B * N * C), buffers["from_frames"], proj, C)
        return self.proj_drop(out.view(B, N, dim))


class PlatonicMlp(nn.Module):
    """Group-convolution MLP: ``GroupConvLinear -> GELU (pointwise, so equivariant) -> GroupConvLinear``.

    With ``basis="fourier"`` the features are Fourier coefficients: the group convolutions are Schur
    linears, and the GELU runs on the hidden frames, reached through coefficient rows (one ``[|G|, |G|]``
    GEMM each way, :func:`~eqvit.nn.rows_mlp.rows_mlp`). The same parameters and function in both bases.
    """

    def __init__(
        self,
        group: FiniteGroup,
        channels: int,
        hidden: int,
        drop: float = 0.0,
        impl: str = "auto",
        basis: str = "frames",
    ) -> None:
        super().__init__()
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r}; valid: {', '.join(BASES)}")
        conv = dict(impl=impl) if basis == "frames" else dict(basis="fourier")
        self.fc1 = GroupConvLinear(group, channels, hidden, **conv)
        self.fc2 = GroupConvLinear(group, hidden, channels, **conv)
        self.in_type = self.out_type = self.fc1.in_type
        if basis == "frames":
            self.act = nn.GELU()
        else:
            hidden_basis = RegularBasis(group, hidden)
            self.act = FourierActivation(hidden_basis.ftype, hidden_basis.basis, nn.GELU())
        self.drop = nn.Dropout(drop)
        # Without hidden dropout the Fourier form keeps one hidden tensor for backward (rows_mlp_lean).
        lean = basis == "fourier" and drop == 0 and activation_kind(self.act.act) is not None
        self._impl = _frames_mlp if basis == "frames" else (_lean_fourier_mlp if lean else _fourier_mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._impl(self, x)


def _frames_mlp(m: PlatonicMlp, x: torch.Tensor) -> torch.Tensor:
    return m.drop(m.fc2(m.drop(m.act(m.fc1(x)))))


def _fourier_mlp(m: PlatonicMlp, x: torch.Tensor) -> torch.Tensor:
    return m.drop(rows_mlp(m.fc1, m.act, m.fc2, x, m.drop))  # the hidden dropout on the frames' values


def _lean_fourier_mlp(m: PlatonicMlp, x: torch.Tensor) -> torch.Tensor:
    return rows_mlp_lean(m.fc1, m.act, m.fc2, x)


def platonic_block(
    group: FiniteGroup,
    channels: int,
    num_heads: int,
    mlp_ratio: float = 4.0,
    qkv_bias: bool = True,
    qk_norm: bool = False,
    drop: float = 0.0,
    attn_drop: float = 0.0,
    drop_path: float = 0.0,
    init_values: float | None = None,
    fused_attn: bool = True,
    scores: str = "frames",
    impl: str = "auto",
    attn: nn.Module | None = None,
    basis: str = "frames",
) -> Block:
    """The Platonic seed's block on regular features ``[B, N, |G| C]``: frame-shared LayerNorms,
    frames-as-heads attention, a group-convolution MLP; ``init_values`` enables LayerScale (a gamma
    ``[C]`` shared across frames), ``None`` leaves it out. ``attn`` replaces the attention layer
    (another head layout, e.g. irrep-wise heads in the Fourier basis). ``basis``: the features on the
    frames or as their Fourier coefficients (the same parameters and function)."""
    if basis not in BASES:
        raise ValueError(f"unknown basis {basis!r}; valid: {', '.join(BASES)}")
    if attn is None:
        args = (group, channels, num_heads, qkv_bias, qk_norm, attn_drop, drop, fused_attn, scores)
        attn = PlatonicAttention(*args, impl) if basis == "frames" else FourierPlatonicAttention(*args)

    def norm() -> nn.Module:
        return (
            RegularLayerNorm(group, channels) if basis == "frames" else FourierLayerNorm(RegularBasis(group, channels))
        )

    return Block(
        norm(),
        attn,
        norm(),
        PlatonicMlp(group, channels, int(channels * mlp_ratio), drop, impl, basis),
        ls1=RegularLayerScale(group, channels, init_values) if init_values is not None else None,
        ls2=RegularLayerScale(group, channels, init_values) if init_values is not None else None,
        drop_path=drop_path,
    )


class FourierToFrames(ExactBuffers):
    """Fourier coefficients ``[..., |G| C]`` (:class:`~eqvit.nn.regular.RegularBasis`) -> the same features on
    the frames ``[..., |G| C]``: ``Q @`` on every channel."""

    def __init__(self, group: FiniteGroup, channels: int) -> None:
        super().__init__()
        basis = RegularBasis(group, channels)
        self.in_type, self.out_type = basis.ftype, FeatureType.frames(group, channels)
        self.order = group.order
        self.register_exact_buffer("q", torch.from_numpy(np.array(basis.q)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.q, x.unflatten(-1, (self.order, -1))).flatten(-2)


class FramePool(nn.Module):
    """Average or maximum over frames: regular features ``[..., |G| * C]`` -> invariant ``[..., C]``."""

    def __init__(self, group_order: int, mode: str = "mean") -> None:
        super().__init__()
        if mode not in FRAME_POOLS:
            raise ValueError(f"unknown frame pooling {mode!r}; valid: {', '.join(FRAME_POOLS)}")
        self.order, self.mode = group_order, mode

    def extra_repr(self) -> str:
        return f"order={self.order}, mode={self.mode!r}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.unflatten(-1, (self.order, -1))
        return frames.mean(-2) if self.mode == "mean" else frames.amax(-2)


class InvariantPoolHead(nn.Module):
    """Classification readout: tokens mean, then a nonlinear pooling over frames, then a linear.

    ``[B, N, |G| C] -> mean over tokens [B, |G| C] -> GroupConvLinear(C -> K) -> pool over frames
    [B, K] -> Linear(K -> classes)``, with the frame pooling either

    - ``"mean"``: GELU, then the frame average. Averaging the frames directly would keep only the
      trivial-irrep part of the features, C numbers that the group convolutions can only fill
      through the blocks' nonlinearities (and C is small for large groups at a fixed width |G| C);
      the GELU between the group convolution and the average reads K invariants from every irrep;
    - ``"max"``: the maximum over frames (the G-pooling of group CNNs), itself nonlinear, so no GELU.
      Each invariant is the response of the best-aligned frame; on rotated MNIST it trained more
      reliably than ``"mean"`` (``benchmarks/ablate.py images``, README).

    The timm classifier interface: :meth:`pre_logits` gives the K invariants ``[B, num_features]``
    (after the dropout), ``fc`` is the classifier and :meth:`reset_classifier` replaces it;
    ``num_classes = 0`` makes ``fc`` the identity, so the head returns the invariants.

    Args:
        group: the frames G.
        channels: C per frame.
        num_classes: logits (0: no classifier, the head returns the invariants).
        hidden: K invariant features (default: the total width ``|G| C``).
        drop: dropout before the classifier.
        pool: ``"mean"`` or ``"max"``.
        basis: the tokens on the frames, or their Fourier coefficients (``"fourier"``: the token mean is
            taken back to the frames, one token per sample).
    """

    def __init__(
        self,
        group: FiniteGroup,
        channels: int,
        num_classes: int,
        hidden: int | None = None,
        drop: float = 0.0,
        pool: str = "mean",
        basis: str = "frames",
    ) -> None:
        super().__init__()
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r}; valid: {', '.join(BASES)}")
        self.to_frames = nn.Identity() if basis == "frames" else FourierToFrames(group, channels)
        self.in_type = FeatureType.frames(group, channels) if basis == "frames" else self.to_frames.in_type
        self.pool = FramePool(group.order, pool)  # validates ``pool``
        hidden = hidden or group.order * channels
        # one pooled token per sample: the windows form (the input gathered, not the dense weight)
        self.lift = GroupConvLinear(group, channels, hidden, impl="windows")
        # Fan-in init: the input is LayerNorm-ed, so pre-activations are O(1) and the GELU is nonlinear.
        nn.init.normal_(self.lift.weight, std=(group.order * channels) ** -0.5)
        self.act = nn.GELU() if pool == "mean" else nn.Identity()
        self.drop = nn.Dropout(drop)
        self.num_features = hidden
        self.reset_classifier(num_classes)

    def reset_classifier(self, num_classes: int) -> None:
        """A fresh classifier ``fc`` of ``num_classes`` logits on the invariants; 0 makes it the identity."""
        self.num_classes = check_num_classes(num_classes)
        like = self.lift.weight
        self.fc = (
            vit_linear(self.num_features, num_classes, device=like.device, dtype=like.dtype)
            if num_classes
            else nn.Identity()
        )

    @property
    def pool_mode(self) -> str:
        """``"mean"`` or ``"max"``: how the frames are pooled."""
        return self.pool.mode

    def pre_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, N, |G| C] -> [B, num_features]``: the pooled invariants, after the dropout."""
        return self.drop(self.pool(self.act(self.lift(self.to_frames(tokens.mean(1))))))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, N, |G| C] -> logits [B, classes]``, invariant to the frames' action."""
        return self.fc(self.pre_logits(tokens))


class FramePoolDense(nn.Module):
    """Dense readout: pool each token over frames, then a dense head on the invariant tokens.

    ``tokens [B, N, |G| C] -> head(tokens pooled to [B, N, C])``, e.g. the icosphere projection
    convolution back onto the vertices, ``[B, C_out, V]``.
    """

    def __init__(self, group_order: int, head: nn.Module) -> None:
        super().__init__()
        self.pool = FramePool(group_order)
        self.head = head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(tokens))
