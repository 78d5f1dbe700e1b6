"""Token-wise building blocks: Mlp, DropPath, LayerScale and the transformer Block."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from eqvit.nn.attention import Attention
from eqvit.nn.init import vit_linear
from eqvit.nn.posenc.base import PositionalScheme


def check_num_classes(num_classes: int) -> int:
    """``num_classes`` as an int, or a ValueError unless it is a non-negative integer (0: no classifier)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ValueError(f"expected num_classes to be a non-negative integer (0: no classifier), got {num_classes!r}")
    return num_classes


class InputCheck(nn.Module):
    """``x -> x``, or a ValueError naming the expected layout and dtype (``domain.check``: ``[B, C, *grid]``
    of the model's floating dtype) and what came. Point-cloud domains take ``(pos, feat)`` and return None.

    The dtype it expects follows the model's casts through an empty buffer. A leaf for ``torch.fx``:
    its shape checks are Python control flow, which a symbolic trace cannot follow.
    """

    def __init__(self, domain: Any, in_chans: int) -> None:
        super().__init__()
        self.domain, self.in_chans = domain, in_chans
        self.register_buffer("dtype_probe", torch.empty(0), persistent=False)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | None:
        self.domain.check(inputs[0] if len(inputs) == 1 else inputs, self.in_chans, self.dtype_probe.dtype)
        return inputs[0] if len(inputs) == 1 else None


class Mlp(nn.Module):
    """Two-layer MLP applied per token: ``[B, N, C] -> [B, N, C_out]``."""

    def __init__(
        self, in_features: int, hidden_features: int | None = None, out_features: int | None = None, drop: float = 0.0
    ) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = vit_linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = vit_linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth per sample on tokens ``[B, N, C]`` (identity at eval time)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty(x.shape[0], 1, 1).bernoulli_(1 - self.p)  # one draw per sample
        return x * keep / (1 - self.p)


class FeatureGather(nn.Module):
    """``x [..., C_in] -> x[..., index]``: a fixed reordering (or selection) of the feature axis.

    Layers put it after a projection to lay the heads out; ``eqvit.fold`` folds it into that
    projection's rows and replaces it by ``nn.Identity``.
    """

    def __init__(self, index: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("index", torch.as_tensor(index, dtype=torch.int64), persistent=False)

    def extra_repr(self) -> str:
        return f"{len(self.index)} features"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(-1, self.index)


class Block(nn.Module):
    """timm's pre-norm transformer block with its layers injected.

    ``x + drop_path(ls1(attn(norm1(x))))``, then ``x + drop_path(ls2(mlp(norm2(x))))`` on ``[B, N, C]``.
    Every family builds it from its own layers (:func:`vit_block`,
    :func:`~eqvit.nn.irrep_blocks.irrep_block`, :func:`~eqvit.nn.platonic.platonic_block`); optional
    parts (LayerScale, drop path) are ``nn.Identity`` when absent, so :meth:`forward` has no branches.
    The block's ``in_type`` / ``out_type`` are its attention's (None for plain features).

    Args:
        norm1, attn, norm2, mlp: the layers; ``attn(x, rope, num_prefix_tokens)``.
        ls1, ls2: LayerScale after the attention / the MLP (None: none).
        drop_path: stochastic-depth rate of both residual branches.
    """

    def __init__(
        self,
        norm1: nn.Module,
        attn: nn.Module,
        norm2: nn.Module,
        mlp: nn.Module,
        *,
        ls1: nn.Module | None = None,
        ls2: nn.Module | None = None,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        self.norm1 = norm1
        self.attn = attn
        self.ls1 = ls1 if ls1 is not None else nn.Identity()
        self.drop_path_rate = drop_path
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm2
        self.mlp = mlp
        self.ls2 = ls2 if ls2 is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    @property
    def in_type(self):
        """The attention's input type (None for plain features); the block maps it to itself."""
        return getattr(self.attn, "in_type", None)

    @property
    def out_type(self):
        return getattr(self.attn, "out_type", None)

    def fold_in_stream(self, basis: nn.Module) -> Block | None:
        """The inference form of this block in a model whose stream is kept in ``basis``
        (:class:`~eqvit.nn.stream.StreamBasis`): its norms ``F.layer_norm`` alone, their affine and the basis folded
        into the attention and the MLP. None when a layer cannot fold so (no ``split_in_stream`` /
        ``fold_in_stream``, a Schur layout, a LayerScale, a norm whose centre ``basis`` does not fit)."""
        if not (isinstance(self.ls1, nn.Identity) and isinstance(self.ls2, nn.Identity)):
            return None
        parts = []
        for norm, layer in ((self.norm1, self.attn), (self.norm2, self.mlp)):
            if not (hasattr(norm, "split_in_stream") and hasattr(layer, "fold_in_stream")):
                return None
            split = norm.split_in_stream(basis)
            folded = None if split is None else layer.fold_in_stream(basis, split[1])
            if folded is None:
                return None
            parts += [split[0], folded]
        return Block(*parts)  # eval only: no drop path

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, C] -> [B, N, C]``."""
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), rope, num_prefix_tokens)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def vit_block(
    dim: int,
    num_heads: int,
    mlp_ratio: float = 4.0,
    qkv_bias: bool = True,
    qk_norm: bool = False,
    drop: float = 0.0,
    attn_drop: float = 0.0,
    drop_path: float = 0.0,
    fused_attn: bool = True,
) -> Block:
    """timm's ViT block on plain features ``[B, N, dim]``: LayerNorm, multi-head attention, GELU MLP."""
    return Block(
        nn.LayerNorm(dim),
        Attention(dim, num_heads, qkv_bias, qk_norm, attn_drop, drop, fused=fused_attn),
        nn.LayerNorm(dim),
        Mlp(dim, int(dim * mlp_ratio), drop=drop),
        drop_path=drop_path,
    )
