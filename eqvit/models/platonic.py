"""Platonic Transformers: the common ViT on regular features over a group of frames (Platonic seed).

Three input families, one block (:class:`~eqvit.nn.platonic.platonic_block`) and one positional
scheme (:class:`~eqvit.nn.posenc.frame_rope.FrameRoPE`):

- ``platonic_points_*``: point clouds ``model(pos [B, N, 3], feat [B, N, C])``, frames T, O, I or
  trivial; invariant class logits (to the frames, translations and point order);
- ``platonic_image_*``: square images ``[B, C, H, W]``, frames C4, D4 or their subgroups; invariant
  class logits;
- ``platonic_sphere_*``: icosphere fields ``[B, C, V]`` on the SO3ViT patches, frames I, O, T;
  dense output ``[B, C_out, V]``.

``embed_dim`` is the total width ``|G| * C`` (the seed matches it across groups, so every model of
a size has the computation graph of a standard ViT of that width); ``num_heads`` is per frame and
defaults to ``max(1, 12 // |G|)`` (one head per frame for T, O, I; 12 heads for the trivial group).

Image models keep their residual stream on the frames or on the frames' Fourier coefficients
(``stream``, :mod:`eqvit.nn.platonic`): the same parameters and function, the Fourier stream computing
the group convolutions as Schur block matmuls (12/64 of the dense multiply-adds for D4 frames).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
from torch import nn

from eqvit.geometry.domain import PointCloudDomain, PointDomain, TokenMap, require_action
from eqvit.geometry.square import square_grid
from eqvit.groups import FiniteGroup, get_group, resolve_group
from eqvit.groups.base import match_matrices
from eqvit.models._checks import check_model_args
from eqvit.models._registry import register_model, strip_timm_kwargs
from eqvit.models._timm import entry_cfg, finish, pop_options, register_cfgs
from eqvit.models.so3vit import SYMMETRY_BREAKING, icosphere_domain, rotations_about_z
from eqvit.models.vit import EquivariantViT, PointCloudViT, build_blocks
from eqvit.nn.basis import AttentionInBasis
from eqvit.nn.irrep_attention import IrrepAttention, get_head_layout, head_layout, list_head_layouts
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Block
from eqvit.nn.platonic import SCORES, FourierToFrames, FramePoolDense, InvariantPoolHead, platonic_block
from eqvit.nn.posenc import LatitudeEncoding, PositionalScheme
from eqvit.nn.posenc.registry import TokenLayout, build_posenc, posenc_name
from eqvit.nn.regular import FourierLayerNorm, RegularBasis, RegularLayerNorm
from eqvit.nn.tokenizers.icosphere import IcosphereUnpatchify
from eqvit.nn.tokenizers.platonic import (
    CentredPoints,
    LiftedIcosphereEmbed,
    LiftedPointEmbed,
    LiftedSquarePatchEmbed,
)
from eqvit.nn.tokenizers.square import square_patch_layout
from eqvit.utils import unknown_name_error

SPATIAL_FRAMES = ("trivial", "T", "O", "I")
IMAGE_FRAMES = ("C1", "C2", "C4", "D1", "D2", "D4")  # the built-in groups of the square lattice
NATIVE_ATTENTIONS = ("frames", "coupled")  # PlatonicAttention's own layouts: scores per frame, or invariant
STREAMS = ("auto", "frames", "fourier")
# stream="auto" keeps image models' residual stream in the Fourier basis from this many channels per frame on
# (below it the Schur form's per-irrep matmuls are too small to beat one dense matmul) and for groups whose
# Schur linears cost at most FOURIER_STREAM_MAX_COST of the dense ones (D4: 12/64; C4: 6/16 does not pay).
FOURIER_STREAM_MIN_CHANNELS = 32
FOURIER_STREAM_MAX_COST = 0.2


@cache
def trivial_3d() -> FiniteGroup:
    """The trivial group acting on 3-D positions (``get_group("trivial")`` is planar)."""
    return FiniteGroup("trivial", np.eye(3)[None])


def spatial_frames(group: str | FiniteGroup) -> FiniteGroup:
    """Frames for 3-D positions: ``"trivial"`` (or ``"C1"``), ``"T"``, ``"O"``, ``"I"``, a group registered with
    :func:`eqvit.groups.register_group` (e.g. Oh, with reflections) or any :class:`~eqvit.groups.FiniteGroup` of
    3x3 orthogonal matrices: point clouds carry no lattice, so every such group acts on them."""
    if group in ("trivial", "C1"):
        return trivial_3d()
    frames = resolve_group(group)
    if frames.dim != 3:
        raise ValueError(f"frames for 3-D positions must be 3x3 matrices; {frames.name} acts in {frames.dim}-D")
    return frames


@cache
def sphere_frames(name: str) -> tuple[FiniteGroup, FiniteGroup]:
    """``(frames, symmetry)`` for icosphere models: the frames placed so the model keeps most symmetry.

    The icosphere is closed under I only. I frames keep I. T frames are taken as I's tetrahedral
    subgroup, so they keep T. O is not a subgroup of I: the frames are the octahedral group rotated
    so that its tetrahedral subgroup is I's, and the model keeps exactly that T (= O n I).
    """
    icosahedral = get_group("I")
    if name in ("trivial", "C1"):
        return trivial_3d(), trivial_3d()
    if name not in SPATIAL_FRAMES:
        raise ValueError(f"unknown frames {name!r} for the sphere; valid: {', '.join(SPATIAL_FRAMES)}")
    if name == "I":
        return icosahedral, icosahedral
    tetra_in_i = icosahedral.subgroup(next(s for s in icosahedral.subgroups() if len(s) == 12), name="T")
    if name == "T":
        return tetra_in_i, tetra_in_i
    octa = get_group("O")
    rotation = _rotation_onto(get_group("T").elements, tetra_in_i.elements)
    rotated = np.einsum("ij,gjk,lk->gil", rotation, octa.elements, rotation)
    return FiniteGroup("O", rotated, irrep_builder=lambda _: octa.irreps), tetra_in_i


def _rotation_onto(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """A rotation Q with ``Q source Q^T == target`` as sets of matrices (both tetrahedral groups).

    The three half-turn axes of a tetrahedral group are orthogonal; Q maps one triple onto the
    other, with the signs and order that also carry the three-fold axes across.
    """

    def half_turn_axes(elements: np.ndarray) -> np.ndarray:
        half = elements[np.abs(np.trace(elements, axis1=1, axis2=2) + 1) < 1e-9]  # trace -1: angle pi
        return np.stack([np.linalg.eigh((h + np.eye(3)) / 2)[1][:, -1] for h in half], axis=1)

    a, b = half_turn_axes(source), half_turn_axes(target)
    for perm in ([0, 1, 2], [1, 0, 2], [0, 2, 1], [2, 1, 0], [1, 2, 0], [2, 0, 1]):
        for signs in np.array(np.meshgrid([1, -1], [1, -1], [1, -1])).T.reshape(-1, 3):
            q = (b[:, perm] * signs) @ a.T
            if np.linalg.det(q) < 0:
                continue
            try:
                match_matrices(np.einsum("ij,gjk,lk->gil", q, source, q), target)
            except ValueError:
                continue
            return q
    raise ValueError("the two groups are not conjugate tetrahedral groups")


def default_heads(group: FiniteGroup, num_heads: int | None) -> int:
    return num_heads if num_heads is not None else max(1, 12 // group.order)


def _channels(group: FiniteGroup, embed_dim: int, num_heads: int) -> int:
    """Channels per frame ``C = embed_dim / |G|``, checked for the head split and RoPE pairs."""
    if embed_dim % group.order:
        raise ValueError(f"embed_dim {embed_dim} must be a multiple of |{group.name}| = {group.order}")
    channels = embed_dim // group.order
    if channels % num_heads or (channels // num_heads) % 2:
        raise ValueError(
            f"embed_dim {embed_dim} gives {channels} channels per frame of {group.name}, which must split into "
            f"{num_heads} heads of an even size (frame RoPE rotates channel pairs)"
        )
    return channels


def stream_cost_ratio(group: FiniteGroup) -> float:
    """Multiply-adds of a group convolution in the Fourier basis relative to the dense one: irrep rho has
    ``m = d_rho / type_factor`` copies in the regular representation; its block costs ``d_rho m^2`` for real
    type and ``(d_rho m)^2`` for the two-matrix form of the others, over ``|G|^2``. D4: 12 / 64, O: 64 / 576."""
    total = 0
    for rho in group.irreps:
        m = rho.dim // rho.type_factor
        total += (rho.dim * m * m) if rho.type == "real" else (rho.dim * m) ** 2
    return total / group.order**2


def choose_stream(stream: str, kind: str, group: FiniteGroup, channels: int, attention: str) -> str:
    """``"frames"`` or ``"fourier"``: the residual stream's basis (:data:`STREAMS`; ValueError where the Fourier
    stream does not apply: point clouds, the sphere, irrep-wise heads)."""
    if stream not in STREAMS:
        raise unknown_name_error("stream", stream, STREAMS)
    supported = kind == "image" and attention in ("frames", "coupled")
    if stream == "auto":
        pays = channels >= FOURIER_STREAM_MIN_CHANNELS and stream_cost_ratio(group) <= FOURIER_STREAM_MAX_COST
        return "fourier" if supported and pays else "frames"
    if stream == "fourier" and not supported:
        raise ValueError(
            f"stream='fourier' applies to image models with attention 'frames' or 'coupled', got kind={kind!r} "
            f"with attention={attention!r}; use stream='frames'"
        )
    return stream


def attention_layouts() -> list[str]:
    """The attention layouts a Platonic model takes: its own two, then the irrep-basis layouts registered with
    :func:`~eqvit.nn.irrep_attention.register_head_layout` (``"irrepwise"`` and any added)."""
    return [*NATIVE_ATTENTIONS, *(n for n in list_head_layouts() if n not in NATIVE_ATTENTIONS)]


def check_attention(attention: str, group: FiniteGroup, channels: int) -> None:
    """ValueError unless ``attention`` is a native layout or a registered layout in the irrep basis."""
    if attention in NATIVE_ATTENTIONS:
        return
    if not isinstance(attention, str) or attention not in list_head_layouts():
        raise unknown_name_error("attention layout", attention, attention_layouts())
    if get_head_layout(attention).basis(FeatureType.regular(group, channels)) is not None:
        raise ValueError(
            f"attention layout {attention!r} is not in the irrep basis; Platonic models run the "
            f"registered layouts in the irrep basis, and their own {list(NATIVE_ATTENTIONS)}"
        )


def _blocks(group: FiniteGroup, channels: int, num_heads: int, options: dict[str, Any], attention: str, rope: bool):
    """Blocks with the ``attention`` layout: frames (scores per frame) and coupled (one score over all
    frames of a channel group, the seed's invariant scores) are :class:`PlatonicAttention`; registered
    irrep-basis layouts (irrep-wise heads) run in the Fourier basis (:class:`~eqvit.nn.basis.AttentionInBasis`
    around an :class:`IrrepAttention`, whose frame RoPE rotates q, k back in the frame basis)."""

    def attn_fn() -> nn.Module | None:
        if attention in NATIVE_ATTENTIONS:
            return None
        ftype = FeatureType.regular(group, channels)
        inner = IrrepAttention(
            ftype,
            head_layout(ftype, num_heads, attention),
            qkv_bias=options["qkv_bias"],
            attn_drop=options["attn_drop"],
            fused=options["fused_attn"],
            frame_rope=(num_heads, channels // num_heads) if rope else None,
        )
        return AttentionInBasis(inner, FeatureType.frames(group, channels))

    def block_fn(index: int, rate: float) -> Block:
        return platonic_block(group, channels, num_heads, drop_path=rate, attn=attn_fn(), **options)

    return block_fn


def build_platonic(
    *,
    kind: str,
    group: str | FiniteGroup,
    in_chans: int,
    num_classes: int | None = None,
    out_chans: int | None = None,
    embed_dim: int | None = None,
    target_width: int | None = None,
    depth: int,
    num_heads: int | None = None,
    mlp_ratio: float = 4.0,
    qkv_bias: bool = True,
    qk_norm: bool = False,
    init_values: float | None = None,
    scores: str = "frames",
    attention: str | None = None,
    posenc: str | PositionalScheme = "frame_rope",
    impl: str = "auto",
    learnable_freqs: bool = False,
    min_wavelength: float | None = None,
    max_wavelength: float | None = None,
    drop_rate: float = 0.0,
    attn_drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    fused_attn: bool = True,
    img_size: int = 32,
    patch_size: int = 4,
    input_level: int = 5,
    patch_level: int = 2,
    symmetry_breaking: str | None = None,
    latitude_degree: int = 8,
    residual: bool = False,
    num_points: int = 64,
    head_pool: str | None = None,
    stream: str = "auto",
) -> EquivariantViT:
    """Build a Platonic Transformer of ``kind`` ``"points"``, ``"image"`` or ``"sphere"``.

    ``head_pool`` is the classifier's pooling over frames (:class:`InvariantPoolHead`): ``None``
    takes ``"max"`` for images and ``"mean"`` for point clouds, the one measured on each task's
    benchmark; sphere models have a dense head and take none.

    ``attention``: ``"frames"`` (frames as heads, the seed's default; ``scores="frames"``), ``"coupled"``
    (heads over all frames of a channel group; ``scores="invariant"``) or ``"irrepwise"`` (heads per irrep
    after the Fourier transform of q, k, v); None takes it from ``scores``. ``posenc``: a scheme registered for
    frame tokens (:mod:`eqvit.nn.posenc.registry`): ``"frame_rope"``, ``"none"``, or with fixed positions
    ``"invariant_ape"`` (the O(2) seed's invariant APE built in the irrep basis and mapped to the frames); or a
    :class:`~eqvit.nn.posenc.PositionalScheme` built for these tokens. ``stream``: the residual stream on the
    frames, on their Fourier coefficients, or ``"auto"`` (:func:`choose_stream`).
    """
    config = {k: v for k, v in locals().items()}
    check_model_args(config)
    config["posenc"] = posenc_name(posenc)
    if isinstance(group, FiniteGroup):
        config["group"] = group.name
    symmetry: FiniteGroup
    if kind == "points":
        frames = symmetry = spatial_frames(group)
    elif kind == "image":
        frames = symmetry = resolve_group(group)
        offsets, centers, _ = square_patch_layout(img_size, patch_size)
        require_action(frames, offsets, "the pixels of a square patch")
        require_action(frames, centers, "the square patch centres")
    elif kind == "sphere":
        frames, symmetry = sphere_frames(group)
    else:
        raise ValueError(f"unknown kind {kind!r}; valid: points, image, sphere")
    if kind != "sphere" and (symmetry_breaking is not None or residual):
        raise ValueError(f"symmetry_breaking and residual apply to sphere models only, not kind {kind!r}")
    if kind == "sphere" and head_pool is not None:
        raise ValueError("head_pool applies to the classifiers (points, image), not to sphere models")
    if symmetry_breaking not in SYMMETRY_BREAKING:
        raise ValueError(f"unknown symmetry_breaking {symmetry_breaking!r}; valid: None, 'latitude'")
    if scores not in SCORES:
        raise ValueError(f"unknown scores {scores!r}; valid: {', '.join(SCORES)}")
    if attention is None:
        attention = "frames" if scores == "frames" else "coupled"
    if scores != "frames" and attention != "coupled":
        raise ValueError(f"scores={scores!r} is the coupled layout; it does not go with attention={attention!r}")
    scores = "invariant" if attention == "coupled" else "frames"
    heads = default_heads(frames, num_heads)
    if embed_dim is None:
        if target_width is None:
            raise ValueError("pass embed_dim (the total width |G| * C) or target_width")
        # The nearest width whose channels per frame split into heads of an even size.
        step = frames.order * heads * 2
        embed_dim = max(step, step * round(target_width / step))
    channels = _channels(frames, embed_dim, heads)
    check_attention(attention, frames, channels)
    if attention not in NATIVE_ATTENTIONS and qk_norm:
        raise ValueError("qk_norm is not defined for irrep-wise heads (a LayerNorm over a head is not equivariant)")
    basis = choose_stream(stream, kind, frames, channels, attention)
    options = dict(
        mlp_ratio=mlp_ratio,
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        drop=drop_rate,
        attn_drop=attn_drop_rate,
        init_values=init_values,
        fused_attn=fused_attn,
        scores=scores,
        impl=impl,
        basis=basis,
    )
    token_type = FeatureType.frames(frames, channels)

    def scheme(positions=None, min_default: float = 0.1, max_default: float = 4.0, **layout: Any) -> PositionalScheme:
        """The positional scheme from the registry, for the tokens at fixed ``positions`` (or bound per batch)."""
        tokens = TokenLayout(embed_dim, heads, channels // heads, token_type, positions=positions, **layout)
        wavelengths = dict(min_wavelength=min_wavelength or min_default, max_wavelength=max_wavelength or max_default)
        return build_posenc(posenc, tokens, learnable_freqs=learnable_freqs, **wavelengths)

    def build(model_cls: type[EquivariantViT], posenc_scheme: PositionalScheme, **kwargs: Any) -> EquivariantViT:
        """The model with the blocks for ``posenc_scheme`` (irrep-wise heads rotate in the frame basis)."""
        kwargs.setdefault("group", symmetry)
        block_fn = _blocks(frames, channels, heads, options, attention, posenc_scheme.rotary_split is not None)
        return model_cls(
            blocks=build_blocks(block_fn, depth, drop_path_rate),
            norm=(
                RegularLayerNorm(frames, channels)
                if basis == "frames"
                else FourierLayerNorm(RegularBasis(frames, channels))
            ),
            embed_dim=embed_dim,
            posenc=posenc_scheme,
            token_type=FeatureType.frames(frames, channels),  # the stream's content, whatever basis keeps it
            to_token_type=FourierToFrames(frames, channels) if basis == "fourier" else None,
            in_chans=in_chans,
            drop_rate=drop_rate,
            config=config,
            **kwargs,
        )

    classes = 10 if num_classes is None else num_classes

    if kind == "points":
        head = InvariantPoolHead(frames, channels, classes, drop=drop_rate, pool=head_pool or "mean")
        model = build(
            PointCloudViT,
            scheme(),
            tokenizer=LiftedPointEmbed(frames, in_chans, channels),
            input_encoding=CentredPoints(),
            head=head,
            domain=PointCloudDomain(3, num_points),
            out_chans=classes or head.num_features,
        )
    elif kind == "image":
        tokenizer = LiftedSquarePatchEmbed(frames, img_size, patch_size, in_chans, channels, basis)
        side = img_size // patch_size
        head = InvariantPoolHead(frames, channels, classes, drop=drop_rate, pool=head_pool or "max", basis=basis)
        coefficients = RegularBasis(frames, channels) if basis == "fourier" else None
        positions = tokenizer.positions.numpy().copy()
        model = build(
            EquivariantViT,
            scheme(positions, 2.0, 4.0 * side, coefficients=coefficients),
            tokenizer=tokenizer,
            head=head,
            domain=PointDomain(
                square_grid(img_size, img_size),
                shape=(img_size, img_size),
                name=f"the {img_size}x{img_size} square grid",
            ),
            out_chans=classes or head.num_features,
            token_grid=TokenMap(
                square_patch_layout(img_size, patch_size)[1],
                (side, side),
                name=f"the {side}x{side} patch grid",
                reduction=patch_size,
            ),
        )
    else:
        tokenizer = LiftedIcosphereEmbed(frames, in_chans, channels, input_level, patch_level)
        out = out_chans or in_chans
        domain = icosphere_domain(input_level)
        input_encoding, kept = None, symmetry
        if symmetry_breaking == "latitude":  # the rotating sphere: keep only the rotations about z
            input_encoding = LatitudeEncoding(domain.points, in_chans, latitude_degree)
            kept = rotations_about_z(symmetry)
        model = build(
            EquivariantViT,
            scheme(tokenizer.positions.numpy().copy()),
            tokenizer=tokenizer,
            head=FramePoolDense(frames.order, IcosphereUnpatchify(channels, out, input_level, patch_level)),
            domain=domain,
            input_encoding=input_encoding,
            residual=residual,
            out_chans=out,
            group=kept,
        )
    return model


def on_frame_stream(model: EquivariantViT) -> EquivariantViT:
    """``model`` with its residual stream on the frames (itself when it is there already): a new model built
    from ``model.config`` with ``stream="frames"``, holding the same parameters (strictly loaded), dtype,
    device, mode and timm configuration. Restriction to a subgroup starts from it."""
    if not isinstance(model.to_token_type, FourierToFrames):  # the stream is on the frames already
        return model
    like = next(model.parameters())
    twin = build_platonic(**{**model.config, "stream": "frames"}).to(device=like.device, dtype=like.dtype)
    twin.load_state_dict(model.state_dict(), strict=True)
    for key in ("default_cfg", "pretrained_cfg"):
        if hasattr(model, key):
            setattr(twin, key, dict(getattr(model, key)))
    return twin.train(model.training)


def _create(variant: str, **kwargs: Any) -> EquivariantViT:
    """Build, attach timm's ``pretrained_cfg`` and honour ``features_only`` (:mod:`eqvit.models._timm`)."""
    options = pop_options(kwargs)
    return finish(build_platonic(**strip_timm_kwargs(kwargs)), variant, options)


# The first and last layer of each input kind: the patch embedding / point lifting, the classifier or the
# icosphere unpatchify's projection.
_LAYERS = {
    "images": ("tokenizer", "head.fc"),
    "points": ("tokenizer.scalar_proj", "head.fc"),
    "sphere": ("tokenizer.embed.proj", "head.head.proj"),
}


def platonic_cfg(
    inputs: str, input_size: tuple[int, ...], num_classes: int, pool_size: tuple[int, int] | None = None, **kw: Any
) -> dict[str, Any]:
    """timm's config of a Platonic Transformer taking ``inputs`` (:data:`~eqvit.models._timm.INPUT_KINDS`)."""
    first_conv, classifier = _LAYERS[inputs]
    return entry_cfg(
        input_size,
        inputs=inputs,
        num_classes=num_classes,
        pool_size=pool_size,
        first_conv=first_conv,
        classifier=classifier,
        **kw,
    )


default_cfgs = register_cfgs(
    {
        "platonic_points_tiny": platonic_cfg("points", (64, 3), 5, in_chans=1),
        "platonic_points_s": platonic_cfg("points", (64, 3), 10, in_chans=1),
        "platonic_image_tiny": platonic_cfg("images", (3, 8, 8), 5, (4, 4)),
        "platonic_image_s": platonic_cfg("images", (1, 32, 32), 10, (8, 8)),
        "platonic_sphere_tiny": platonic_cfg("sphere", (3, 642), 0),
        "platonic_sphere_4x128": platonic_cfg("sphere", (3, 10242), 0),
    }
)


@register_model
def platonic_points_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Tiny point-cloud Platonic Transformer for tests: I frames (4 channels each), depth 2."""
    model_args = dict(kind="points", group="I", in_chans=1, num_classes=5, embed_dim=240, depth=2, mlp_ratio=2.0)
    return _create("platonic_points_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def platonic_points_s(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Point-cloud classifier: O frames, width 480 (20 channels per frame), depth 6."""
    model_args = dict(kind="points", group="O", in_chans=1, num_classes=10, embed_dim=480, depth=6)
    return _create("platonic_points_s", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def platonic_image_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Tiny image Platonic Transformer for tests: D4 frames, 8x8 images, 2x2 patches, depth 3 (timm's
    feature tests ask for three feature levels)."""
    model_args = dict(
        kind="image", group="D4", in_chans=3, num_classes=5, embed_dim=48, depth=3, img_size=8, patch_size=2
    )
    return _create("platonic_image_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def platonic_image_s(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Image classifier: D4 frames, 32x32 images (padded MNIST), 4x4 patches, width 192, depth 6."""
    model_args = dict(
        kind="image", group="D4", in_chans=1, num_classes=10, embed_dim=192, depth=6, img_size=32, patch_size=4
    )
    return _create("platonic_image_s", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def platonic_sphere_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Tiny sphere model for tests: I frames (4 channels each), icosphere level 3, 240 tokens, depth 2."""
    model_args = dict(
        kind="sphere", group="I", in_chans=3, embed_dim=240, depth=2, input_level=3, patch_level=1, mlp_ratio=2.0
    )
    return _create("platonic_sphere_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def platonic_sphere_4x128(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Sphere model at SO3ViT 4x128's size: depth 4, width nearest 128 (I: 120, 2 channels per frame), 960 tokens."""
    model_args = dict(kind="sphere", group="I", in_chans=3, target_width=128, depth=4)
    return _create("platonic_sphere_4x128", pretrained=pretrained, **dict(model_args, **kwargs))
