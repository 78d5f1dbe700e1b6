"""DiP: a Platonic Transformer as the denoiser of a Diffusion Transformer (Platonic seed, Sec. 5, Tables 3 and 4).

``model(pos [B, N, 3], feat [B, N, 5], t [B]) -> [B, N, 3 + 5]``: noisy atom positions (Å), noisy atom-type
features (H, C, N, O, F) and the diffusion time in [0, 1]; the output is a vector per atom (the position
noise or the clean positions, :mod:`eqvit.diffusion`), with zero centre of mass, and 5 invariant scalars per
atom (the type part). The network is DiT's (Peebles and Xie 2023) with the Platonic Transformer's layers:

- positions centred (:class:`~eqvit.nn.tokenizers.platonic.CentredPoints`) and lifted with the types to
  regular features on the frames (:class:`~eqvit.nn.tokenizers.platonic.LiftedPointEmbed`); frame RoPE carries
  the relative positions into every attention;
- blocks with adaLN-Zero conditioning on the time (:class:`~eqvit.nn.adaln.AdaLNZeroBlock`): the time
  embedding is invariant, so its shifts, scales and gates act per channel, the same in every frame;
- DiT's final layer: a modulated frame-shared LayerNorm, then the equivariant vector readout
  (:class:`~eqvit.nn.readout.FrameVectorReadout`) and an invariant one for the types, both zero-initialised.

The output rotates with the frames G acting on the positions (its first 3 channels; the types do not move),
is unchanged by translations and permutes with the atoms. ``group`` picks the frames (``"trivial"``, ``"T"``,
``"O"``, ``"I"``); at a fixed ``embed_dim = |G| C`` every choice costs what a standard DiT of that width costs
(the trivial model has ``12 // 1`` heads where T has one head per frame, seed App. F).

Batches hold molecules of one atom count (the generation task buckets them), so attention needs no mask.

Registered: ``dip_qm9_tiny`` (tests), ``dip_qm9_trivial``, ``dip_qm9_T``, ``dip_qm9_O`` (width 192, depth 4;
``group="I"`` needs a width that is a multiple of 60, e.g. ``embed_dim=240``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from eqvit.geometry.domain import parameter_dtype
from eqvit.geometry.noisy_points import NoisyPointCloudDomain, PointVectorAction
from eqvit.groups import FiniteGroup
from eqvit.models._checks import check_model_args, positive_int
from eqvit.models._registry import register_model, strip_timm_kwargs
from eqvit.models._timm import entry_cfg, finish, pop_options, register_cfgs
from eqvit.models.molecules import ATTENTIONS, FixedKeyAttention
from eqvit.models.platonic import _channels, default_heads, spatial_frames
from eqvit.nn.adaln import AdaLNZeroBlock, FrameModulation, TimestepEmbedding, modulate
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.platonic import PlatonicAttention, PlatonicMlp
from eqvit.nn.posenc.registry import TokenLayout, build_posenc
from eqvit.nn.readout import FrameScalarReadout, FrameVectorReadout
from eqvit.nn.regular import RegularLayerNorm
from eqvit.nn.tokenizers.platonic import CentredPoints, LiftedPointEmbed
from eqvit.utils import unknown_name_error

NUM_TYPES = 5  # H, C, N, O, F


class DenoiserHead(nn.Module):
    """DiT's final layer on regular features: a frame-shared LayerNorm, the adaLN shift and scale, then a vector
    per atom (centre of mass removed) and ``num_types`` invariant scalars, both readouts zero-initialised.

    ``tokens [B, N, |G| C]``, ``cond [B, D]`` -> ``[B, N, d + num_types]``.
    """

    def __init__(self, group: FiniteGroup, channels: int, cond_dim: int, num_types: int) -> None:
        super().__init__()
        self.norm = RegularLayerNorm(group, channels)
        self.modulation = FrameModulation(group.order, channels, cond_dim, 2)
        self.vector = FrameVectorReadout(group, channels, zero_init=True)
        self.scalars = FrameScalarReadout(group.order, channels, num_types, zero_init=True)

    def forward(self, tokens: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        shift, scale = self.modulation(cond)
        x = modulate(self.norm(tokens), shift, scale)
        vectors = self.vector(x)
        return torch.cat([vectors - vectors.mean(1, keepdim=True), self.scalars(x)], dim=-1)


class PlatonicDenoiser(nn.Module):
    """The DiP denoiser (module docstring): ``model(pos, feat, t) -> [B, N, 3 + in_chans]``.

    Args:
        frames: the group of frames G.
        channels: C per frame (the width is ``|G| C``).
        depth: blocks.
        num_heads: heads per frame.
        mlp_ratio: MLP width / token width.
        cond_dim: width of the time embedding.
        attention: ``"softmax"`` (learned keys) or ``"fixed_keys"``
            (:class:`~eqvit.models.molecules.FixedKeyAttention`).
        posenc: a scheme registered for frame tokens (:mod:`eqvit.nn.posenc.registry`), e.g. ``"frame_rope"`` or
            ``"none"``.
        qkv_bias, qk_norm: as in timm.
        min_wavelength, max_wavelength: frame RoPE's range, in Å.
        in_chans: atom-type features (the type scalars of the output match them).
        num_points: the atom count of :meth:`~eqvit.geometry.noisy_points.NoisyPointCloudDomain.random_input`.
        drop_path_rate: stochastic depth, linear over the blocks.
        fused_attn, impl: SDPA or the reference attention; the group convolutions' implementation.
        config: the builder's arguments (saved in checkpoints).
    """

    def __init__(
        self,
        *,
        frames: FiniteGroup,
        channels: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        cond_dim: int,
        attention: str,
        posenc: str,
        qkv_bias: bool,
        qk_norm: bool,
        min_wavelength: float,
        max_wavelength: float,
        in_chans: int,
        num_points: int,
        drop_path_rate: float,
        fused_attn: bool,
        impl: str,
        config: dict[str, Any],
    ) -> None:
        super().__init__()
        G = frames.order
        self.group = self.frames = frames
        self.in_chans, self.out_chans = in_chans, frames.dim + in_chans
        self.embed_dim = self.num_features = G * channels
        self.domain = NoisyPointCloudDomain(frames.dim, num_points)
        self.output_action = PointVectorAction(frames.dim)
        self.config = dict(config)
        self.input_encoding = CentredPoints()
        self.tokenizer = LiftedPointEmbed(frames, in_chans, channels)
        self.time_embed = TimestepEmbedding(cond_dim)
        layout = TokenLayout(G * channels, num_heads, channels // num_heads, FeatureType.frames(frames, channels))
        self.posenc = build_posenc(posenc, layout, min_wavelength=min_wavelength, max_wavelength=max_wavelength)
        attn_cls = FixedKeyAttention if attention == "fixed_keys" else PlatonicAttention
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # plain floats: meta-device builds
        self.blocks = nn.ModuleList(
            AdaLNZeroBlock(
                RegularLayerNorm(frames, channels),
                attn_cls(frames, channels, num_heads, qkv_bias, qk_norm, 0.0, 0.0, fused_attn, "frames", impl),
                RegularLayerNorm(frames, channels),
                PlatonicMlp(frames, channels, int(channels * mlp_ratio), impl=impl),
                FrameModulation(G, channels, cond_dim, 6),
                drop_path=rate,
            )
            for rate in rates
        )
        self.head = DenoiserHead(frames, channels, cond_dim, in_chans)

    def forward(self, pos: torch.Tensor, feat: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``pos [B, N, 3]``, ``feat [B, N, in_chans]``, ``t [B]`` -> ``[B, N, 3 + in_chans]``."""
        self.domain.check((pos, feat, t), self.in_chans, parameter_dtype(self))
        pos, feat = self.input_encoding(pos, feat)
        tokens, rope = self.tokenizer(pos, feat), self.posenc.rope_for(pos)
        cond = self.time_embed(t)
        for block in self.blocks:
            tokens = block(tokens, cond, rope)
        return self.head(tokens, cond)


def build_dip(
    *,
    group: str = "T",
    in_chans: int = NUM_TYPES,
    embed_dim: int = 192,
    depth: int = 4,
    num_heads: int | None = None,
    mlp_ratio: float = 4.0,
    cond_dim: int = 128,
    attention: str = "softmax",
    posenc: str = "frame_rope",
    qkv_bias: bool = True,
    qk_norm: bool = True,
    min_wavelength: float = 0.5,
    max_wavelength: float = 8.0,
    drop_path_rate: float = 0.0,
    fused_attn: bool = True,
    impl: str = "auto",
    num_points: int = 18,
) -> PlatonicDenoiser:
    """A DiP denoiser (module docstring); wavelengths in Å, ``num_points`` only sizes random inputs."""
    config = {k: v for k, v in locals().items()}
    check_model_args(config)
    positive_int("cond_dim", cond_dim, " (the width of the time embedding)")
    if attention not in ATTENTIONS:
        raise unknown_name_error("attention (dip)", attention, ATTENTIONS)
    frames = spatial_frames(group)
    heads = default_heads(frames, num_heads)
    return PlatonicDenoiser(
        frames=frames,
        channels=_channels(frames, embed_dim, heads),
        depth=depth,
        num_heads=heads,
        mlp_ratio=mlp_ratio,
        cond_dim=cond_dim,
        attention=attention,
        posenc=posenc,
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        min_wavelength=min_wavelength,
        max_wavelength=max_wavelength,
        in_chans=in_chans,
        num_points=num_points,
        drop_path_rate=drop_path_rate,
        fused_attn=fused_attn,
        impl=impl,
        config=config,
    )


def _create(variant: str, **kwargs: Any) -> PlatonicDenoiser:
    options = pop_options(kwargs)
    kwargs = strip_timm_kwargs(kwargs)
    if "num_classes" in kwargs or "global_pool" in kwargs:
        raise ValueError(
            f"{variant} is a denoiser: it returns a vector and {kwargs.get('in_chans', NUM_TYPES)} type scalars per "
            "atom, not class logits, so it takes no num_classes or global_pool"
        )
    return finish(build_dip(**kwargs), variant, options)


def dip_cfg(num_points: int) -> dict[str, Any]:
    """timm's config of a denoiser on ``pos [num_points, 3]`` with ``NUM_TYPES`` type channels."""
    return entry_cfg(
        (num_points, 3),
        inputs="points",
        num_classes=0,
        first_conv="tokenizer.scalar_proj",
        classifier="head.scalars.proj",
        in_chans=NUM_TYPES,
    )


default_cfgs = register_cfgs(
    {"dip_qm9_tiny": dip_cfg(6), **{f"dip_qm9_{frames}": dip_cfg(18) for frames in ("trivial", "T", "O", "I")}}
)


@register_model
def dip_qm9_tiny(pretrained: bool = False, **kwargs: Any) -> PlatonicDenoiser:
    """Tiny DiP for tests: T frames (4 channels each), depth 2."""
    model_args = dict(group="T", embed_dim=48, depth=2, mlp_ratio=2.0, cond_dim=16, num_points=6)
    return _create("dip_qm9_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def dip_qm9_trivial(pretrained: bool = False, **kwargs: Any) -> PlatonicDenoiser:
    """DiP with trivial frames (a translation-equivariant DiT with RoPE): width 192, depth 4, 12 heads."""
    model_args = dict(group="trivial")
    return _create("dip_qm9_trivial", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def dip_qm9_T(pretrained: bool = False, **kwargs: Any) -> PlatonicDenoiser:
    """DiP with tetrahedral frames: width 192 (16 channels per frame), depth 4, one head per frame."""
    model_args = dict(group="T")
    return _create("dip_qm9_T", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def dip_qm9_O(pretrained: bool = False, **kwargs: Any) -> PlatonicDenoiser:
    """DiP with octahedral frames: width 192 (8 channels per frame), depth 4, one head per frame."""
    model_args = dict(group="O")
    return _create("dip_qm9_O", pretrained=pretrained, **dict(model_args, **kwargs))
