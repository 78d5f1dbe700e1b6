"""``eqvit.fuse(model)``: the inference form of a model, and the one place where folding happens.

A training forward derives its dense weights from the parameters on every call (irrep-wise
linears, group convolutions, Fourier bases, tiled affines) and keeps no cache that could go stale.
:func:`fuse` computes all of that once, on a copy, and swaps in the inference layers of
:mod:`eqvit.nn.fused` (timm's ``reparameterize_model``, escnn's ``export()``). The fused model computes
the same function (the tests check every registered model in float64), has no trainable parameters
and is meant for ``eval()`` / ``no_grad`` use; train the original and fuse again after an update.

On irrep-wise models (the O(2) ViTs) it also moves the residual stream into the norms' reflected
basis (:mod:`eqvit.nn.norm`): every norm becomes one ``F.layer_norm`` read through folded weights,
the cost of timm's. Their intermediate token maps (``forward_intermediates``) are then in that basis;
take maps from the unfused model.

Each layer type has one fuser (:func:`register_fuser`); a module without one is kept and its
children are fused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from eqvit.models.vit import EquivariantViT
from eqvit.nn.basis import AttentionInBasis
from eqvit.nn.fused import (
    FoldedInvariantHead,
    FrozenAPE,
    FrozenFourierConv,
    FrozenIrrepAttention,
    FrozenIrrepLayerNorm,
    FrozenLayerNorm,
    FrozenLinear,
    FrozenMlp,
    FrozenSchurAttention,
    FrozenSchurLinear,
    FrozenSquareLift,
    ReflectedFinalNorm,
    ReflectedIrrepBlock,
    ReflectedPlanarEmbedding,
)
from eqvit.nn.fused_frames import FrozenFrameAttention
from eqvit.nn.irrep_attention import IrrepAttention
from eqvit.nn.irrep_blocks import InvariantHead, IrrepMlp
from eqvit.nn.layers import Block, FeatureGather
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.platonic import PlatonicAttention
from eqvit.nn.posenc.base import NoPositionalEncoding
from eqvit.nn.posenc.invariant import InvariantAPE
from eqvit.nn.posenc.learned import OrbitAPE
from eqvit.nn.regular import GroupConvLinear, RegularLayerNorm
from eqvit.nn.tokenizers.planar import GroupPatchEmbed, PlanarTokenizer
from eqvit.nn.tokenizers.platonic import LiftedSquarePatchEmbed

Fuser = Callable[[nn.Module], nn.Module]
_FUSERS: dict[type, Fuser] = {}


def register_fuser(cls: type) -> Callable[[Fuser], Fuser]:
    """Register ``fn(module) -> inference module`` for modules of type ``cls`` (and its subclasses)."""

    def decorate(fn: Fuser) -> Fuser:
        _FUSERS[cls] = fn
        return fn

    return decorate


def fuse(model: nn.Module) -> nn.Module:
    """The inference form of ``model``: a fused copy in ``eval()`` mode computing the same function.

    Works on every registered model (and on any module built from eqvit layers); ``model`` itself is
    left as it is.
    """
    fused = copy.deepcopy(model).eval()
    with torch.no_grad():
        fused = _fuse(fused)
    return fused.requires_grad_(False)


def _fuse(module: nn.Module) -> nn.Module:
    for cls in type(module).__mro__:
        if cls in _FUSERS:
            return _FUSERS[cls](module)
    return _fuse_children(module)


def _fuse_children(module: nn.Module) -> nn.Module:
    for name, child in list(module.named_children()):
        fused = _fuse(child)
        if fused is not child:
            setattr(module, name, fused)
    return module


# ---------------------------------------------------------------------------------------------------
# layers


@register_fuser(IrrepLinear)
def _irrep_linear(m: IrrepLinear) -> nn.Module:
    if m.schur:  # block matmuls stay block matmuls
        return FrozenSchurLinear(m)
    return FrozenLinear(*m.dense(), in_type=m.in_type, out_type=m.out_type)


@register_fuser(GroupPatchEmbed)
def _patch_embed(m: GroupPatchEmbed) -> nn.Module:
    return FrozenLinear(*m.dense(), in_type=m.in_type, out_type=m.out_type)


@register_fuser(IrrepLayerNorm)
def _irrep_norm(m: IrrepLayerNorm) -> nn.Module:
    return FrozenIrrepLayerNorm(m)


@register_fuser(IrrepAttention)
def _irrep_attention(m: IrrepAttention) -> nn.Module:
    return FrozenSchurAttention(m) if m.schur else FrozenIrrepAttention(m)


@register_fuser(IrrepMlp)
def _irrep_mlp(m: IrrepMlp) -> nn.Module:
    if m.schur:  # the Fourier transforms stay per-token around the GELU; the linears are frozen
        return _fuse_children(m)
    w1, b1, w2, b2 = m.folded_weights()
    return FrozenMlp(w1, b1, m.act.act, w2, b2, in_type=m.in_type)


@register_fuser(InvariantHead)
def _invariant_head(m: InvariantHead) -> nn.Module:
    return FoldedInvariantHead(m) if isinstance(m.fc, nn.Linear) else m


@register_fuser(InvariantAPE)
def _invariant_ape(m: InvariantAPE) -> nn.Module:
    return FrozenAPE(m.embedding())


@register_fuser(OrbitAPE)
def _orbit_ape(m: OrbitAPE) -> nn.Module:
    return FrozenAPE(m.embedding())


@register_fuser(AttentionInBasis)
def _attention_in_basis(m: AttentionInBasis) -> nn.Module:
    """``inner(x @ A) @ A^T`` with ``A`` folded into the inner layer's qkv columns and projection rows."""
    if not isinstance(m.inner, IrrepAttention):
        return _fuse_children(m)
    a = m.to_inner
    qkv_w, qkv_b, proj_w, proj_b = m.inner.fused_weights()
    frozen = FrozenIrrepAttention(
        m.inner, (qkv_w @ a.T, qkv_b, a.to(proj_w.dtype) @ proj_w, None if proj_b is None else a @ proj_b)
    )
    frozen.in_type = frozen.out_type = m.in_type
    return frozen


@register_fuser(GroupConvLinear)
def _group_conv(m: GroupConvLinear) -> nn.Module:
    if m.impl == "fourier":
        return FrozenFourierConv(m)
    return FrozenLinear(*m.gather_dense(), in_type=m.in_type, out_type=m.out_type)


@register_fuser(RegularLayerNorm)
def _regular_norm(m: RegularLayerNorm) -> nn.Module:
    return FrozenLayerNorm(*m.tiled_affine(), m.eps)


@register_fuser(LiftedSquarePatchEmbed)
def _square_lift(m: LiftedSquarePatchEmbed) -> nn.Module:
    return FrozenSquareLift(m)


@register_fuser(PlatonicAttention)
def _platonic_attention(m: PlatonicAttention) -> nn.Module:
    _fuse_children(m)
    if isinstance(m.qkv, FrozenLinear) and isinstance(m.head_order, FeatureGather):
        # The head layout's gather becomes the order of the projection's rows.
        index = m.head_order.index
        m.qkv = FrozenLinear(m.qkv.weight[index], None if m.qkv.bias is None else m.qkv.bias[index])
        m.head_order = nn.Identity()
    plain = isinstance(m.q_norm, nn.Identity) and isinstance(m.k_norm, nn.Identity)
    # (only PlatonicAttention itself: subclasses such as fixed-key attention project differently)
    if type(m) is PlatonicAttention and m.scores == "frames" and plain and isinstance(m.head_order, nn.Identity):
        # Frames as heads without qk-norm: timm's attention with |G| H heads and the rotation in place.
        frozen = [isinstance(p, FrozenLinear) for p in (m.qkv, m.proj)]
        if all(frozen):
            return FrozenFrameAttention(
                m.qkv.weight,
                m.qkv.bias,
                m.proj.weight,
                m.proj.bias,
                m.order * m.num_heads,
                m.head_dim,
                m.sdpa,
                in_type=m.in_type,
            )
    return m


# ---------------------------------------------------------------------------------------------------
# models: the reflected residual stream of irrep-wise ViTs


def _reflected_stream_applies(model: nn.Module) -> bool:
    """A ViT whose every norm is an :class:`IrrepLayerNorm` with the final norm's centre, whose blocks are
    irrep-wise attention and MLP, and whose tokens come from a planar tokenizer with an invariant APE."""
    norm = getattr(model, "norm", None)
    if not isinstance(norm, IrrepLayerNorm) or not isinstance(getattr(model, "tokenizer", None), PlanarTokenizer):
        return False
    if norm.ftype.layout != "copies":  # folding the reflection would densify the Schur linears
        return False
    if not isinstance(getattr(model, "posenc", None), InvariantAPE):
        return False
    reflection = norm.reflect_row
    for block in model.blocks:
        if not (
            isinstance(block, Block)
            and isinstance(block.attn, IrrepAttention)
            and isinstance(block.mlp, IrrepMlp)
            and all(isinstance(b, nn.Identity) for b in (block.ls1, block.ls2))
            and all(isinstance(n, IrrepLayerNorm) for n in (block.norm1, block.norm2))
            and all(torch.equal(n.reflect_row, reflection) for n in (block.norm1, block.norm2))
        ):
            return False
    return True


@register_fuser(EquivariantViT)
def _fuse_model(model: nn.Module) -> nn.Module:
    if not _reflected_stream_applies(model):
        return _fuse_children(model)
    norm = model.norm
    model.tokenizer = ReflectedPlanarEmbedding(model.tokenizer, model.posenc, norm)
    model.posenc = NoPositionalEncoding()  # folded into the embedding
    model.blocks = nn.ModuleList(ReflectedIrrepBlock(block, norm.eps) for block in model.blocks)
    model.norm = ReflectedFinalNorm(norm)
    return _fuse_children(model)  # the head, the input encoding
