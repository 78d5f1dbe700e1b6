"""The common ViT: tokenizer -> positional scheme -> blocks -> norm -> head.

Every model family builds this class with its own tokenizer, positional scheme and head; the
family modules only register configurations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from eqvit.geometry.domain import parameter_dtype
from eqvit.groups import FiniteGroup
from eqvit.nn.buffers import DerivedCache
from eqvit.nn.irrep_blocks import InvariantHead, IrrepBlock
from eqvit.nn.layers import Block
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.posenc.base import NoPositionalEncoding, PositionalScheme
from eqvit.nn.posenc.invariant import InvariantAPE
from eqvit.nn.tokenizers.planar import PlanarTokenizer


def _init_weights(module: nn.Module) -> None:
    """timm's ViT init: truncated normal (std 0.02) linear weights, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class EquivariantViT(nn.Module):
    """A timm-style ViT whose parts decide which group it is equivariant to.

    Args:
        tokenizer: ``x -> tokens [B, N, embed_dim]``.
        head: ``tokens [B, N, embed_dim] -> output``.
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias, qk_norm: the usual ViT sizes.
        posenc: positional scheme; rotary schemes go into attention, others add to tokens.
        input_encoding: applied to the raw input before tokenization (e.g. latitude encoding).
        residual: predict ``x + model(x)`` (needs in_chans == out_chans and a dense head).
        group: the group the model is exactly equivariant to (for ``assert_equivariant``).
        domain: the input domain (``.points``, ``.shape``, ``.act``, ``.check``).
        in_chans, out_chans: channel counts, checked on input.
        output_action: ``"same"`` (dense outputs on the input domain) or ``"invariant"``.
        fused_attn: SDPA (True) or the reference attention path (False) in the default blocks.
        block_fn: ``block_fn(index, drop_path) -> block`` for families whose blocks act on
            irrep or regular features; blocks are called as ``block(tokens, rope, num_prefix_tokens)``.
            Defaults to the plain :class:`~eqvit.nn.layers.Block`.
        norm_layer: the final norm (default ``nn.LayerNorm(embed_dim)``).
        num_prefix_tokens: tokens the tokenizer prepends (class tokens), skipped by positional schemes.
        config: the keyword arguments the model was built with (saved in checkpoints).
    """

    def __init__(
        self,
        *,
        tokenizer: nn.Module,
        head: nn.Module,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        posenc: PositionalScheme | None = None,
        input_encoding: nn.Module | None = None,
        residual: bool = False,
        group: FiniteGroup | None = None,
        domain: Any = None,
        in_chans: int = 3,
        out_chans: int = 3,
        output_action: str = "same",
        fused_attn: bool = True,
        block_fn: Callable[[int, float], nn.Module] | None = None,
        norm_layer: nn.Module | None = None,
        num_prefix_tokens: int = 0,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if residual and in_chans != out_chans:
            raise ValueError(f"residual prediction needs in_chans == out_chans, got {in_chans} and {out_chans}")
        self.in_chans, self.out_chans = in_chans, out_chans
        self.embed_dim = self.num_features = embed_dim
        self.group = group
        self.domain = domain
        self.output_action = output_action
        self.residual = residual
        self.config = dict(config or {})
        self.input_encoding = input_encoding if input_encoding is not None else nn.Identity()
        self.tokenizer = tokenizer
        self.posenc = posenc if posenc is not None else NoPositionalEncoding()
        # Rotary schemes are handed to attention; decided once here, not in forward.
        self.rope = self.posenc if self.posenc.is_rotary else None
        self.pos_drop = nn.Dropout(drop_rate)
        self.num_prefix_tokens = num_prefix_tokens
        rates = torch.linspace(0, drop_path_rate, depth).tolist()
        if block_fn is None:

            def block_fn(index: int, rate: float) -> nn.Module:
                return Block(
                    embed_dim, num_heads, mlp_ratio, qkv_bias, qk_norm, drop_rate, attn_drop_rate, rate, fused_attn
                )

        self.blocks = nn.ModuleList(block_fn(i, rate) for i, rate in enumerate(rates))
        self.norm = norm_layer if norm_layer is not None else nn.LayerNorm(embed_dim)
        self.head = head
        self.apply(_init_weights)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {name for name, _ in self.named_parameters() if "pos_embed" in name}

    def embed_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Input -> tokens ``[B, N, embed_dim]`` with the additive positional encoding, before the blocks."""
        tokens = self.tokenizer(self.input_encoding(x))
        p = self.num_prefix_tokens
        tokens = (
            torch.cat([tokens[:, :p], self.posenc.add_to_tokens(tokens[:, p:])], dim=1)
            if p
            else self.posenc.add_to_tokens(tokens)
        )
        return self.pos_drop(tokens)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Input -> normalised tokens ``[B, N, embed_dim]``."""
        tokens = self.embed_tokens(x)
        for block in self.blocks:
            tokens = block(tokens, self.rope, self.num_prefix_tokens)
        return self.norm(tokens)

    def forward_head(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.domain is not None:
            self.domain.check(x, self.in_chans, parameter_dtype(self))
        out = self.forward_head(self.forward_features(x))
        return out + x if self.residual else out


class IrrepViT(EquivariantViT, DerivedCache):
    """:class:`EquivariantViT` on irrep-wise tokens (the O(2)-subgroup ViTs) with a reflected residual stream.

    The stream between the blocks is kept as ``H x``, ``H`` the Householder reflection of the norms
    (:mod:`eqvit.nn.norm`), so each block norm is one ``F.layer_norm`` like timm's; tokens enter it
    after the positional encoding and leave it before the final norm, so :meth:`forward_features`
    returns irrep-wise normalised tokens ``[B, N, dim]``. With a planar tokenizer and an invariant
    APE, ``H`` is folded into the patch filters, the encoding and the class token
    (:meth:`reflected_embedding`); without autograd the blocks add their residuals into the stream
    in place. With an :class:`InvariantHead` (it reads
    the class token), :meth:`forward` normalises the class token only. Takes the arguments of
    :class:`EquivariantViT`; every block must be an :class:`IrrepBlock` whose norms share the final
    norm's centre.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(self.norm, IrrepLayerNorm):
            raise ValueError(f"IrrepViT needs an IrrepLayerNorm as the final norm, got {type(self.norm).__name__}")
        reflection = self.norm._exact_masters["reflect_row"]
        for i, block in enumerate(self.blocks):
            if not isinstance(block, IrrepBlock):
                raise ValueError(f"IrrepViT needs IrrepBlocks, block {i} is a {type(block).__name__}")
            for norm in (block.norm1, block.norm2):
                if not torch.equal(norm._exact_masters["reflect_row"], reflection):
                    raise ValueError(f"block {i} centres a norm on other coordinates than the final norm")

    def _folds_embedding(self) -> bool:
        """Whether the entry reflection can be folded into the embedding: a planar tokenizer, an invariant
        APE and no active token dropout (dropout does not commute with ``H``)."""
        return (
            isinstance(self.tokenizer, PlanarTokenizer)
            and isinstance(self.posenc, InvariantAPE)
            and not (self.training and self.pos_drop.p > 0)
        )

    def reflected_embedding(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """``(H F [dim, in_chans * K], H b, P H [M, dim], H cls [dim] or None)``: the patch filters, bias,
        APE and class token of a planar tokenizer with an invariant APE, reflected into the stream's
        basis (cached while no gradient is recorded)."""
        tokenizer, posenc, norm = self.tokenizer, self.posenc, self.norm
        embed, cls = tokenizer.embed, tokenizer.cls_token

        def compute():
            filters, bias = embed.dense()
            pos = posenc.embedding()
            return (
                norm.reflect(filters.T).T.contiguous(),  # H is symmetric: H F = (F^T H)^T
                None if bias is None else norm.reflect(bias),
                norm.reflect(pos),
                None if cls is None else norm.reflect(tokenizer.class_token()),
            )

        sources = [*embed.proj.leaves(), embed._buffers["filter_basis"], cls, *posenc.parameters()]
        sources += [*norm._buffers.values(), *posenc._buffers.values()]
        return self.derived("reflected_embedding", sources, compute)

    def embed_stream(self, x: torch.Tensor) -> torch.Tensor:
        """Input -> the residual stream entering the blocks, ``H embed_tokens(x)`` ``[B, N, dim]``, a fresh
        tensor. With a planar tokenizer and an invariant APE, ``H`` is folded into their weights."""
        if not self._folds_embedding():
            return self.norm.reflect(self.embed_tokens(x))
        filters, bias, pos, cls = self.reflected_embedding()
        patches = self.tokenizer.patch_tokens_with(self.input_encoding(x), filters, bias)  # [B, M, dim]
        if cls is None:
            return self.pos_drop(patches + pos)
        B, M, dim = patches.shape
        if torch.is_grad_enabled():
            return self.pos_drop(torch.cat([cls.expand(B, 1, dim), patches + pos], dim=1))
        stream = patches.new_empty(B, 1 + M, dim)  # without autograd: add straight into the stream
        stream[:, 0] = cls
        torch.add(patches, pos, out=stream[:, 1:])
        return self.pos_drop(stream)

    def forward_stream(self, x: torch.Tensor) -> torch.Tensor:
        """Input -> the residual stream after the blocks, ``H x`` ``[B, N, dim]`` (not normalised)."""
        stream = self.embed_stream(x)  # a fresh tensor: the blocks may add into it
        for block in self.blocks:
            stream = block(stream, self.rope, self.num_prefix_tokens, reflected=True, overwrite=True)
        return stream

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Input -> irrep-wise normalised tokens ``[B, N, dim]``."""
        return self.norm(self.norm.reflect(self.forward_stream(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.domain is not None:
            self.domain.check(x, self.in_chans, parameter_dtype(self))
        stream = self.forward_stream(x)
        if isinstance(self.head, InvariantHead) and self.num_prefix_tokens:
            stream = stream[:, :1]  # the head reads only the class token: normalise only that
        out = self.forward_head(self.norm(self.norm.reflect(stream)))
        return out + x if self.residual else out


class PointCloudViT(EquivariantViT):
    """The common ViT on point clouds: ``model(pos [B, N, d], feat [B, N, C])``.

    Tokens are the points. Positions change per sample, so the rotary scheme is bound to each
    batch (``posenc.bind(pos)``); positions are centred first, which makes the model exactly
    translation invariant. There are no prefix tokens and no token order.
    """

    def forward_features(self, pos: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """``(pos [B, N, d], feat [B, N, C]) ->`` normalised tokens ``[B, N, embed_dim]``."""
        centred = pos - pos.mean(dim=1, keepdim=True)
        tokens = self.pos_drop(self.tokenizer(centred, feat))
        rope = self.posenc.bind(centred) if self.posenc.is_rotary else None
        for block in self.blocks:
            tokens = block(tokens, rope, 0)
        return self.norm(tokens)

    def forward(self, pos: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        self.domain.check((pos, feat), self.in_chans, parameter_dtype(self))
        return self.forward_head(self.forward_features(pos, feat))
