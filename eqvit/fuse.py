"""``eqvit.fuse(model)``: the inference form of a model, and the one place where folding happens.

A training forward derives its dense weights from the parameters on every call (irrep-wise
linears, group convolutions, Fourier bases, tiled affines) and keeps no cache that could go stale.
:func:`fuse` computes all of that once, on a copy, and swaps in the inference layers of
:mod:`eqvit.nn.fused` (timm's ``reparameterize_model``, escnn's ``export()``). The fused model computes
the same function (the tests check every registered model in float64), has no trainable parameters
and is meant for ``eval()`` / ``no_grad`` use; train the original and fuse again after an update.

On Platonic image models whose channels per frame make it pay (:data:`FOURIER_STREAM_MIN_CHANNELS`) it
keeps the residual stream in the Fourier basis (:mod:`eqvit.nn.fused_fourier`): the group convolutions
become Schur block matmuls and the frames are visited only around the GELU and for frame RoPE and
frames-as-heads attention. Their intermediate token maps are then Fourier coefficients.

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

from eqvit.groups import FiniteGroup
from eqvit.models.vit import EquivariantViT
from eqvit.nn.basis import AttentionInBasis
from eqvit.nn.fused import (
    FoldedInvariantHead,
    FrozenAPE,
    FrozenFourierConv,
    FrozenIcosphereLift,
    FrozenIcosphereUnpatchify,
    FrozenIrrepAttention,
    FrozenIrrepLayerNorm,
    FrozenLayerNorm,
    FrozenLinear,
    FrozenMlp,
    FrozenSchurAttention,
    FrozenSquareLift,
    ReflectedFinalNorm,
    ReflectedIrrepBlock,
    ReflectedPlanarEmbedding,
)
from eqvit.nn.fused_fourier import (
    FourierFrameAttention,
    FramesReadout,
    RegularBasis,
    fold_into_lift,
    fourier_mlp,
    irrep_norm_from_regular,
    stream_cost_ratio,
)
from eqvit.nn.fused_frames import FrozenFrameAttention
from eqvit.nn.fused_schur import (
    FourierSlabMlp,
    FrozenSchurLinear,
    SchurCoupledAttention,
    fourier_slab_mlp_applies,
    schur_coupled_attention_applies,
)
from eqvit.nn.irrep_attention import IrrepAttention
from eqvit.nn.irrep_blocks import InvariantHead, IrrepMlp
from eqvit.nn.layers import Block, FeatureGather
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.platonic import InvariantPoolHead, PlatonicAttention, PlatonicMlp
from eqvit.nn.posenc.base import NoPositionalEncoding
from eqvit.nn.posenc.frame_rope import FrameRoPE
from eqvit.nn.posenc.invariant import InvariantAPE
from eqvit.nn.posenc.learned import OrbitAPE
from eqvit.nn.regular import FOURIER_COST_RATIO, GroupConvLinear, RegularLayerNorm, RegularLayerScale
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed, IcosphereUnpatchify
from eqvit.nn.tokenizers.planar import GroupPatchEmbed, PlanarTokenizer
from eqvit.nn.tokenizers.platonic import LiftedSquarePatchEmbed

Fuser = Callable[[nn.Module], nn.Module]

# The Fourier-basis stream of Platonic models needs this many channels per frame: below it the Schur
# form's per-irrep GEMMs are too small to beat one dense GEMM (benchmarks/platonic_speed.py, scale_speed.py).
FOURIER_STREAM_MIN_CHANNELS = 48
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
    if schur_coupled_attention_applies(m):
        return SchurCoupledAttention(m)
    return FrozenSchurAttention(m) if m.schur else FrozenIrrepAttention(m)


@register_fuser(IrrepMlp)
def _irrep_mlp(m: IrrepMlp) -> nn.Module:
    if m.schur:  # block matmuls around the Fourier transforms, the hidden features in coefficient rows
        fused = _fuse_children(m)
        if fourier_slab_mlp_applies(fused.fc1, fused.act, fused.fc2):
            return FourierSlabMlp(fused.fc1, fused.act, fused.fc2)
        return fused
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


@register_fuser(IcospherePatchEmbed)
def _icosphere_lift(m: IcospherePatchEmbed) -> nn.Module:
    return FrozenIcosphereLift(m)


@register_fuser(IcosphereUnpatchify)
def _icosphere_unpatchify(m: IcosphereUnpatchify) -> nn.Module:
    return FrozenIcosphereUnpatchify(m)


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


# ---------------------------------------------------------------------------------------------------
# models: the Fourier-basis stream of Platonic models


def _fourier_stream_applies(model: nn.Module) -> bool:
    """A Platonic image model (square lift, frame RoPE or no positional scheme, no prefix tokens, the
    pooling head) of plain frames-as-heads blocks with enough channels per frame for Schur linears to pay."""
    frames, norm = getattr(model, "frames", None), getattr(model, "norm", None)
    if not isinstance(frames, FiniteGroup) or not isinstance(norm, RegularLayerNorm):
        return False
    if norm.channels < FOURIER_STREAM_MIN_CHANNELS or stream_cost_ratio(frames) > FOURIER_COST_RATIO:
        return False
    if not isinstance(model.tokenizer, LiftedSquarePatchEmbed) or type(model.head) is not InvariantPoolHead:
        return False
    if model.num_prefix_tokens or not isinstance(model.posenc, (FrameRoPE, NoPositionalEncoding)):
        return False
    if not isinstance(model.input_encoding, nn.Identity):
        return False
    for block in model.blocks:
        attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
        if not (
            type(block) is Block
            and type(attn) is PlatonicAttention
            and attn.scores == "frames"
            and isinstance(attn.q_norm, nn.Identity)
            and isinstance(attn.k_norm, nn.Identity)
            and type(mlp) is PlatonicMlp
            and all(isinstance(n, RegularLayerNorm) for n in (block.norm1, block.norm2))
            and all(isinstance(ls, (nn.Identity, RegularLayerScale)) for ls in (block.ls1, block.ls2))
        ):
            return False
    return True


def _fourier_stream(model: nn.Module) -> nn.Module:
    """Every block, the final norm, the lift and the head rewritten on Fourier coefficients."""
    basis = RegularBasis(model.frames, model.norm.channels)
    model.tokenizer = fold_into_lift(FrozenSquareLift(model.tokenizer), basis)
    model.blocks = nn.ModuleList(
        Block(
            irrep_norm_from_regular(b.norm1, basis),
            FourierFrameAttention(b.attn, basis),
            irrep_norm_from_regular(b.norm2, basis),
            fourier_mlp(b.mlp, basis),
            ls1=b.ls1,  # a per-channel scale commutes with T = Q (x) I_C
            ls2=b.ls2,
        )
        for b in model.blocks
    )
    model.head = FramesReadout(model.head, basis, model.norm.weight)
    model.norm = irrep_norm_from_regular(model.norm, basis)
    return _fuse_children(model)  # the head's lift


@register_fuser(EquivariantViT)
def _fuse_model(model: nn.Module) -> nn.Module:
    if _fourier_stream_applies(model):
        return _fourier_stream(model)
    if not _reflected_stream_applies(model):
        return _fuse_children(model)
    norm = model.norm
    model.tokenizer = ReflectedPlanarEmbedding(model.tokenizer, model.posenc, norm)
    model.posenc = NoPositionalEncoding()  # folded into the embedding
    model.blocks = nn.ModuleList(ReflectedIrrepBlock(block, norm.eps) for block in model.blocks)
    model.norm = ReflectedFinalNorm(norm)
    return _fuse_children(model)  # the head, the input encoding
