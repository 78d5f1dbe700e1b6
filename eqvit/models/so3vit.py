"""SO3ViT: icosphere patches lifted to SO(3), SO(3)-RoPE attention (SO(3)-RoPE seed).

Configurations follow the seed's Table 1 (depth x width); ``so3vit_tiny`` exists so that the
test suite runs every registered model.

Heads (from the seed's grid 1, 2, 4, 8) are chosen so that the SO(3)-RoPE degree L grows with
the width, as the seed argues (Sec. 4.2: wider models allow higher Wigner-D orders and so finer
positional resolution): four heads at every width, head_dim 32 / 64 / 128 at width 128 / 256 /
512, i.e. L = 4 / 7 / 10 ((L+1)^2 <= head_dim). At width 128 four heads of 32 are cheaper than
two of 64 and keep RoPE's cost low.

Parameter counts against Table 1 (``eqvit info so3vit_4x128`` ...): 0.83M / 3.23M / 12.75M /
50.58M / 101.0M here, 0.98M / 3.54M / 13.37M / 51.12M / 101.45M in the seed. Why they differ,
exactly: fitting the seed's five counts as ``a * depth + b`` gives ``a = 3.146M = 12 * 512^2``
per block at width 512 (our timm blocks: 12 W^2 + 13 W, the same up to biases) and ``b`` =
0.19M / 0.39M / 0.79M at width 128 / 256 / 512, i.e. ``b = 1536 W`` within the rounding:
``2 x 3 channels x 256 taps`` for the lifting and the unpatchify. 256 = 4^4 is the number of
level-6 sub-triangles in one level-2 patch: the seed's kernels read 256 samples per patch (its
input resolution is not stated; 256 taps fit a signal on the faces of a level-6 icosphere,
81,920 samples). Our input is the 10,242 vertices of icosphere level 5 (the shallow-water data
and every test use it), whose level-2 patch holds (8+1)(8+2)/2 = 45 vertices: 2 x 3 x 45 = 270
parameters per width, the whole difference (0.19M - 0.035M at width 128). No triangle kernel on
these 45 vertices reaches 256 taps without interpolating (which the seed's lifting avoids), and
the kernel's support cannot grow past the patch without crossing the 12 five-fold vertices,
where the flat lattice does not fit (no exact rotation covariance). Matching the count would
mean changing the data to level-6 faces: 8x the samples for every SWE run, which we do not do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from eqvit.geometry.domain import PointDomain
from eqvit.geometry.icosphere import icosphere
from eqvit.groups import FiniteGroup, get_group
from eqvit.models._checks import check_model_args
from eqvit.models._registry import refuse_classifier_kwargs, register_model, strip_timm_kwargs
from eqvit.models._timm import entry_cfg, finish, pop_options, register_cfgs
from eqvit.models.vit import EquivariantViT, build_blocks
from eqvit.nn.layers import vit_block
from eqvit.nn.posenc import LatitudeEncoding, PositionalScheme
from eqvit.nn.posenc.registry import TokenLayout, build_posenc, posenc_name
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed, IcosphereUnpatchify

SYMMETRY_BREAKING = (None, "latitude")


def rotations_about_z(group: FiniteGroup) -> FiniteGroup:
    """The subgroup of rotations fixing the z-axis (C5 in the icosahedral group)."""
    keep = np.flatnonzero(np.abs(group.elements[:, :, 2] - np.array([0.0, 0.0, 1.0])).max(-1) < 1e-9)
    return group.subgroup(keep, name=f"C{len(keep)}(z)")


def icosphere_domain(level: int) -> PointDomain:
    sphere = icosphere(level)
    return PointDomain(sphere.vertices, name=f"icosphere level {level}", weights=sphere.vertex_areas)


def build_so3vit(
    *,
    in_chans: int = 3,
    out_chans: int = 3,
    input_level: int = 5,
    patch_level: int = 2,
    embed_dim: int = 128,
    depth: int = 4,
    num_heads: int = 4,
    mlp_ratio: float = 4.0,
    qk_norm: bool = False,
    posenc: str | PositionalScheme = "so3rope",
    symmetry_breaking: str | None = None,
    latitude_degree: int = 8,
    residual: bool = False,
    drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    fused_attn: bool = True,
) -> EquivariantViT:
    """Build an SO3ViT.

    ``posenc``: a scheme registered for plain tokens (:mod:`eqvit.nn.posenc.registry`): ``"so3rope"`` (the
    seed's), ``"none"``, ``"learned"`` (a learned APE that is exactly invariant: one vector per orbit of the
    token poses under the icosahedral rotations, :class:`~eqvit.nn.posenc.OrbitAPE`) or ``"ape"`` (a learned
    vector per token, breaking every symmetry: the ``vit_ape_*`` ablation); or a
    :class:`~eqvit.nn.posenc.PositionalScheme` built for these tokens.
    """
    config = dict(locals())
    check_model_args(config)
    config["posenc"] = posenc_name(posenc)
    if symmetry_breaking not in SYMMETRY_BREAKING:
        raise ValueError(f"unknown symmetry_breaking {symmetry_breaking!r}; valid: None, 'latitude'")
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
    tokenizer = IcospherePatchEmbed(in_chans, embed_dim, input_level, patch_level)
    head = IcosphereUnpatchify(embed_dim, out_chans, input_level, patch_level)
    domain = icosphere_domain(input_level)
    group = get_group("I")
    layout = TokenLayout(
        embed_dim, num_heads, embed_dim // num_heads, poses=tokenizer.lifting.poses, pose_symmetry=group
    )
    scheme = build_posenc(posenc, layout)
    input_encoding = None
    if symmetry_breaking == "latitude":
        input_encoding = LatitudeEncoding(domain.points, in_chans, latitude_degree)
        group = rotations_about_z(group)
    if not scheme.keeps_symmetry:
        group = None  # e.g. a learned APE keeps no symmetry of the sphere

    def block_fn(index: int, drop_path: float) -> nn.Module:
        return vit_block(
            embed_dim, num_heads, mlp_ratio, qk_norm=qk_norm, drop=drop_rate, drop_path=drop_path, fused_attn=fused_attn
        )

    return EquivariantViT(
        tokenizer=tokenizer,
        blocks=build_blocks(block_fn, depth, drop_path_rate),
        norm=nn.LayerNorm(embed_dim),
        head=head,
        embed_dim=embed_dim,
        posenc=scheme,
        input_encoding=input_encoding,
        domain=domain,
        group=group,
        in_chans=in_chans,
        out_chans=out_chans,
        residual=residual,
        drop_rate=drop_rate,
        config=config,
    )


def _create(variant: str, **kwargs: Any) -> EquivariantViT:
    """Build and attach timm's ``pretrained_cfg`` (:mod:`eqvit.models._timm`); a dense model, no classifier."""
    refuse_classifier_kwargs(variant, kwargs)
    options = pop_options(kwargs)
    return finish(build_so3vit(**strip_timm_kwargs(kwargs)), variant, options)


def so3vit_cfg(level: int) -> dict[str, Any]:
    """timm's config of a dense icosphere model on ``[3, V]`` at icosphere ``level``."""
    vertices = 10 * 4**level + 2
    return entry_cfg((3, vertices), inputs="sphere", num_classes=0, first_conv="tokenizer.proj", classifier="head.proj")


default_cfgs = register_cfgs(
    {
        "so3vit_tiny": so3vit_cfg(3),
        **{name: so3vit_cfg(5) for name in ("so3vit_4x128", "so3vit_4x256", "so3vit_4x512")},
        **{name: so3vit_cfg(5) for name in ("so3vit_16x512", "so3vit_32x512")},
    }
)


@register_model
def so3vit_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Tiny SO3ViT for tests: level-3 input (642 vertices), 80 patches, 240 tokens."""
    model_args = dict(input_level=3, patch_level=1, embed_dim=32, depth=2, num_heads=2)
    return _create("so3vit_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def so3vit_4x128(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    model_args = dict(depth=4, embed_dim=128, num_heads=4)
    return _create("so3vit_4x128", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def so3vit_4x256(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    model_args = dict(depth=4, embed_dim=256, num_heads=4)
    return _create("so3vit_4x256", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def so3vit_4x512(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    model_args = dict(depth=4, embed_dim=512, num_heads=4)
    return _create("so3vit_4x512", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def so3vit_16x512(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    model_args = dict(depth=16, embed_dim=512, num_heads=4)
    return _create("so3vit_16x512", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def so3vit_32x512(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    model_args = dict(depth=32, embed_dim=512, num_heads=4)
    return _create("so3vit_32x512", pretrained=pretrained, **dict(model_args, **kwargs))
