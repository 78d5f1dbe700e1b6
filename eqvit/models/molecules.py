"""Platonic Transformers for molecules (QM9 property regression, Platonic seed Sec. 5 / App. H, M).

``model(pos [B, N, 3], atoms [B, N, 5])``: positions in Å and the one-hot atom type (H, C, N, O, F,
:data:`eqvit.data.qm9.ELEMENTS`), so the atom-type embedding is the tokenizer's scalar projection
(a linear map of a one-hot row is a row of an embedding table). Positions are centred
(:class:`~eqvit.nn.tokenizers.platonic.CentredPoints`), lifted to regular features on the frames
(:class:`~eqvit.nn.tokenizers.platonic.LiftedPointEmbed`), and frame RoPE carries the relative
positions into attention. The head pools the atoms (sum or mean), lifts, pools the frames and
regresses ``num_targets`` invariant scalars; the output is exactly invariant to the frames acting
on the positions, to translations and to the order of the atoms.

A batch holds molecules of one atom count (the QM9 task buckets them), so attention needs no mask
and SDPA keeps its fused kernels.

``attention``: ``"softmax"`` (learned keys: the standard q k^T softmax attention) or
``"fixed_keys"``, the seed's choice for QM9 (App. M): every key is the same constant vector before
frame RoPE, ``k_j = rho(R^-1 p_j) 1``, so the score ``q_i . rho(R^-1 (p_j - p_i)) 1`` is a kernel of
the relative position only, shaped by the query (an adaptive, content-steered convolution). The
constant is the same in every frame, so the keys are invariant regular features and the layer
stays equivariant; the projection computes q and v only.

Registered sizes: ``platonic_qm9_tiny`` (tests), ``platonic_qm9_s`` (width 240, depth 4, T frames).
``group`` picks the frames (``"trivial"``, ``"T"``, ``"O"``, ``"I"``); at a fixed ``embed_dim`` =
``|G| * C`` every choice has a standard transformer's cost, so the plain transformer of the
benchmark is ``group="trivial", posenc="none", attention="softmax"``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from eqvit.geometry.domain import PointCloudDomain
from eqvit.groups import FiniteGroup
from eqvit.models._checks import check_model_args
from eqvit.models._registry import register_model, strip_timm_kwargs
from eqvit.models._timm import finish, pop_options, register_cfgs
from eqvit.models.platonic import _channels, default_heads, platonic_cfg, spatial_frames
from eqvit.models.restrict_platonic import restrictor
from eqvit.models.vit import EquivariantViT, PointCloudViT, build_blocks
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.platonic import FrameProjectedAttention, InvariantPoolHead, PlatonicAttention, platonic_block
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.posenc.registry import TokenLayout, build_posenc, posenc_name
from eqvit.nn.regular import RegularLayerNorm
from eqvit.nn.tokenizers.platonic import CentredPoints, LiftedPointEmbed
from eqvit.utils import unknown_name_error

ATTENTIONS = ("softmax", "fixed_keys")
ATOM_POOLS = ("sum", "mean")
NUM_ELEMENTS = 5  # H, C, N, O, F
MEAN_ATOMS = 18.0  # QM9's mean atom count: sum pooling divides by it so the pooled features stay O(1)


class FixedKeyAttention(FrameProjectedAttention):
    """Frames-as-heads attention whose keys are one constant vector, rotated by frame RoPE (seed App. M).

    ``x [B, N, |G| C] -> [B, N, |G| C]``. The group-convolution projection gives q and v only (``2 C`` channels
    per frame, reordered to ``(q/v, frame, channel)``: :class:`~eqvit.nn.platonic.FrameProjectedAttention`);
    the keys are ones before the rotation. Arguments as :class:`~eqvit.nn.platonic.PlatonicAttention`
    (``qk_norm`` normalises the queries).
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
        super().__init__(group, channels, num_heads, 2, qkv_bias, attn_drop, proj_drop, fused, scores, impl)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()  # the keys are constant

    def forward(
        self, x: torch.Tensor, rope: PositionalScheme | None = None, num_prefix_tokens: int = 0
    ) -> torch.Tensor:
        """``x [B, N, |G| C] -> [B, N, |G| C]``."""
        qv = self.project_qkv(x)  # [B, N, 2, G H, D]
        q = self.q_norm(qv[:, :, 0])
        qk = torch.stack([q, torch.ones_like(q)], dim=2)  # the fixed keys, before RoPE
        if rope is not None:
            qk = rope.rotate_qk_stacked_(qk, num_prefix_tokens)
        out = self._attend(*qk.unbind(2), qv[:, :, 1], self.sdpa, *self._score_args)
        return self.proj_drop(self.proj(out))


@restrictor(FixedKeyAttention)
def _refuse_fixed_keys(attn: FixedKeyAttention, context: Any) -> nn.Module:
    raise ValueError("restriction to a subgroup is not implemented for fixed-key attention (attention='fixed_keys')")


def _sum_atoms(tokens: torch.Tensor) -> torch.Tensor:
    return tokens.sum(1) / MEAN_ATOMS


def _mean_atoms(tokens: torch.Tensor) -> torch.Tensor:
    return tokens.mean(1)


class MoleculeHead(InvariantPoolHead):
    """:class:`InvariantPoolHead` with the atoms pooled by ``atom_pool``: ``"sum"`` (divided by
    :data:`MEAN_ATOMS`; extensive properties such as energies) or ``"mean"``. Frames: GELU then mean.

    ``tokens [B, N, |G| C] -> [B, num_targets]``.
    """

    def __init__(
        self, group: FiniteGroup, channels: int, num_targets: int, atom_pool: str = "sum", drop: float = 0.0
    ) -> None:
        if atom_pool not in ATOM_POOLS:
            raise unknown_name_error("atom_pool", atom_pool, ATOM_POOLS)
        super().__init__(group, channels, num_targets, drop=drop, pool="mean")
        self.atom_pool = atom_pool
        self.reduce_atoms = _sum_atoms if atom_pool == "sum" else _mean_atoms  # chosen once: no branch in forward

    def extra_repr(self) -> str:
        return f"atom_pool={self.atom_pool!r}"

    def pre_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, N, |G| C] -> [B, num_features]`` invariants."""
        return self.drop(self.pool(self.act(self.lift(self.reduce_atoms(tokens)))))


def build_molecule_model(
    *,
    group: str = "T",
    num_targets: int = 1,
    in_chans: int = NUM_ELEMENTS,
    embed_dim: int = 240,
    depth: int = 4,
    num_heads: int | None = None,
    mlp_ratio: float = 4.0,
    qkv_bias: bool = True,
    qk_norm: bool = False,
    attention: str = "fixed_keys",
    posenc: str | PositionalScheme = "frame_rope",
    atom_pool: str = "sum",
    min_wavelength: float = 0.5,
    max_wavelength: float = 8.0,
    learnable_freqs: bool = False,
    drop_rate: float = 0.0,
    attn_drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    fused_attn: bool = True,
    impl: str = "auto",
    num_points: int = 18,
) -> EquivariantViT:
    """A Platonic molecule model (see the module docstring); ``num_points`` is only the atom count of
    :meth:`~eqvit.geometry.domain.PointCloudDomain.random_input`. Wavelengths are in Å."""
    config = {k: v for k, v in locals().items()}
    check_model_args(config)
    config["posenc"] = posenc_name(posenc)
    if attention not in ATTENTIONS:
        raise unknown_name_error("attention (molecules)", attention, ATTENTIONS)
    if not isinstance(num_targets, int) or isinstance(num_targets, bool) or num_targets < 0:
        raise ValueError(f"expected num_targets >= 1 (0: the head returns its invariants), got {num_targets!r}")
    frames = spatial_frames(group)
    heads = default_heads(frames, num_heads)
    channels = _channels(frames, embed_dim, heads)
    attn_cls = FixedKeyAttention if attention == "fixed_keys" else PlatonicAttention

    def block_fn(index: int, rate: float) -> nn.Module:
        attn = attn_cls(
            frames, channels, heads, qkv_bias, qk_norm, attn_drop_rate, drop_rate, fused_attn, "frames", impl
        )
        return platonic_block(frames, channels, heads, mlp_ratio, drop=drop_rate, drop_path=rate, attn=attn, impl=impl)

    layout = TokenLayout(embed_dim, heads, channels // heads, FeatureType.frames(frames, channels))
    rope = build_posenc(
        posenc, layout, min_wavelength=min_wavelength, max_wavelength=max_wavelength, learnable_freqs=learnable_freqs
    )
    head = MoleculeHead(frames, channels, num_targets, atom_pool=atom_pool, drop=drop_rate)
    return PointCloudViT(
        tokenizer=LiftedPointEmbed(frames, in_chans, channels),
        blocks=build_blocks(block_fn, depth, drop_path_rate),
        norm=RegularLayerNorm(frames, channels),
        head=head,
        embed_dim=embed_dim,
        posenc=rope,
        input_encoding=CentredPoints(),
        domain=PointCloudDomain(3, num_points),
        group=frames,
        token_type=FeatureType.frames(frames, channels),
        in_chans=in_chans,
        out_chans=num_targets or head.num_features,
        drop_rate=drop_rate,
        config=config,
    )


def _create(variant: str, **kwargs: Any) -> EquivariantViT:
    options = pop_options(kwargs)
    kwargs = strip_timm_kwargs(kwargs)
    if "num_classes" in kwargs:  # timm's name for the outputs
        kwargs["num_targets"] = kwargs.pop("num_classes")
    return finish(build_molecule_model(**kwargs), variant, options)


default_cfgs = register_cfgs(
    {
        "platonic_qm9_tiny": platonic_cfg("points", (6, 3), 1, in_chans=NUM_ELEMENTS),
        "platonic_qm9_s": platonic_cfg("points", (18, 3), 1, in_chans=NUM_ELEMENTS),
    }
)


@register_model
def platonic_qm9_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Tiny molecule model for tests: T frames (4 channels each), depth 2, fixed keys."""
    model_args = dict(group="T", embed_dim=48, depth=2, mlp_ratio=2.0, num_points=6)
    return _create("platonic_qm9_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def platonic_qm9_s(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """QM9 regressor: T frames, width 240 (20 channels per frame), depth 4, fixed keys, sum over atoms."""
    model_args = dict(group="T", embed_dim=240, depth=4)
    return _create("platonic_qm9_s", pretrained=pretrained, **dict(model_args, **kwargs))
