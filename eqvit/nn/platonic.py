"""Platonic Transformer blocks on regular features ``[B, N, |G| * C]`` (Platonic Transformer seed).

The computation graph is a standard ViT's at width ``|G| * C``: group-convolution linears
(:class:`~eqvit.nn.regular.GroupConvLinear`) replace the dense ones, frames become extra heads
of SDPA, and norms / LayerScale share their parameters across frames.
"""

from __future__ import annotations

import torch
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.nn.attention import stacked_qk
from eqvit.nn.init import vit_linear
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Block, FeatureGather, check_num_classes
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.regular import GroupConvLinear, RegularLayerNorm, RegularLayerScale
from eqvit.nn.sdpa import ScaledDotProductAttention

SCORES = ("frames", "invariant")
FRAME_POOLS = ("mean", "max")


class PlatonicAttention(nn.Module):
    """Self-attention on regular features with frames as heads.

    Per frame, ``C`` channels split into ``H`` heads of ``D = C / H``. ``scores="frames"`` (the
    seed's default) runs ``|G| * H`` independent heads ``[B, |G| H, N, D]``, one attention pattern
    per frame; ``scores="invariant"`` (seed eq. 13) merges frames into the head channels,
    ``[B, H, N, |G| D]``, so each score sums the frames' scores before the softmax and one pattern
    is shared by all frames. Rotary schemes (frame RoPE) rotate ``q, k`` stacked, ``[B, N, 2, |G| H, D]``,
    in place.

    The qkv projection's output is reordered (``head_order``, folded into its rows by ``eqvit.fuse``)
    from frames-major ``(G, 3, H, D)`` to ``(3, G, H, D)``: q, k and v are then plain views, as in
    timm, and q and k are rotated together in one op.

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
        super().__init__()
        if channels % num_heads:
            raise ValueError(f"channels per frame {channels} must be divisible by num_heads {num_heads}")
        if scores not in SCORES:
            raise ValueError(f"unknown scores {scores!r}; valid: {', '.join(SCORES)}")
        self.order, self.channels, self.num_heads = group.order, channels, num_heads
        self.in_type = self.out_type = FeatureType.frames(group, channels)
        self.head_dim = channels // num_heads
        self.scores = scores
        self.sdpa = ScaledDotProductAttention(attn_drop, fused)
        self.qkv = GroupConvLinear(group, channels, 3 * channels, bias=qkv_bias, impl=impl)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.proj = GroupConvLinear(group, channels, channels, impl=impl)
        self.proj_drop = nn.Dropout(proj_drop)
        # Row r of the qkv output in (q/k/v, frame, channel) order reads row (frame, q/k/v, channel);
        # eqvit.fuse folds this gather into the projection's rows.
        rows = torch.arange(3 * group.order * channels).view(group.order, 3, channels).transpose(0, 1)
        self.head_order = FeatureGather(rows.flatten())

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, N, |G| C] -> [B, N, 3, |G| H, D]``: q, k, v with frames-major heads."""
        out = self.head_order(self.qkv(x))
        return out.unflatten(-1, (3, self.order * self.num_heads, self.head_dim))

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, |G| C] -> [B, N, |G| C]``."""
        B, N, _ = x.shape
        G, H, D = self.order, self.num_heads, self.head_dim
        qkv = self.project_qkv(x)  # [B, N, 3, G H, D]
        qk = stacked_qk(qkv, self.q_norm, self.k_norm)
        if rope is not None:  # in place: qkv is this layer's own fresh projection
            qk = rope.rotate_qk_stacked_(qk, num_prefix_tokens)
        q, k, v = *qk.unbind(2), qkv[:, :, 2]  # [B, N, G H, D] each
        if self.scores == "frames":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, G H, N, D]
        else:  # merge frames into the head channels: [B, H, N, G D]
            q, k, v = (t.reshape(B, N, G, H, D).permute(0, 3, 1, 2, 4).reshape(B, H, N, G * D) for t in (q, k, v))
        out = self.sdpa(q, k, v)
        if self.scores == "frames":
            out = out.transpose(1, 2)  # [B, N, G H, D], already frames-major
        else:
            out = out.reshape(B, H, N, G, D).permute(0, 2, 3, 1, 4)  # [B, N, G, H, D]
        return self.proj_drop(self.proj(out.reshape(B, N, G * H * D)))

    @property
    def fused(self) -> bool:
        return self.sdpa.fused


class PlatonicMlp(nn.Module):
    """Group-convolution MLP: ``GroupConvLinear -> GELU (pointwise, so equivariant) -> GroupConvLinear``."""

    def __init__(self, group: FiniteGroup, channels: int, hidden: int, drop: float = 0.0, impl: str = "auto") -> None:
        super().__init__()
        self.in_type = self.out_type = FeatureType.frames(group, channels)
        self.fc1 = GroupConvLinear(group, channels, hidden, impl=impl)
        self.act = nn.GELU()
        self.fc2 = GroupConvLinear(group, hidden, channels, impl=impl)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


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
) -> Block:
    """The Platonic seed's block on regular features ``[B, N, |G| C]``: frame-shared LayerNorms,
    frames-as-heads attention, a group-convolution MLP; ``init_values`` enables LayerScale (a gamma
    ``[C]`` shared across frames), ``None`` leaves it out. ``attn`` replaces the attention layer
    (another head layout, e.g. irrep-wise heads in the Fourier basis)."""
    G = group.order
    if attn is None:
        attn = PlatonicAttention(
            group, channels, num_heads, qkv_bias, qk_norm, attn_drop, drop, fused_attn, scores, impl
        )
    return Block(
        RegularLayerNorm(G, channels),
        attn,
        RegularLayerNorm(G, channels),
        PlatonicMlp(group, channels, int(channels * mlp_ratio), drop, impl),
        ls1=RegularLayerScale(G, channels, init_values) if init_values is not None else None,
        ls2=RegularLayerScale(G, channels, init_values) if init_values is not None else None,
        drop_path=drop_path,
    )


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
    """

    def __init__(
        self,
        group: FiniteGroup,
        channels: int,
        num_classes: int,
        hidden: int | None = None,
        drop: float = 0.0,
        pool: str = "mean",
    ) -> None:
        super().__init__()
        self.pool = FramePool(group.order, pool)  # validates ``pool``
        hidden = hidden or group.order * channels
        self.lift = GroupConvLinear(group, channels, hidden, impl="cayley")
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
        return self.drop(self.pool(self.act(self.lift(tokens.mean(1)))))

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
