"""ViTs equivariant to discrete subgroups of O(2) (O(2) seed): square D4 family, hexagonal D6 family.

Tokens are G-patchified grid patches (Def. 3) embedded into ``V = 3q`` copies of the regular
representation stored irrep-wise (eq. 2); invariant APE (Sec. 4.2.2), coupled or irrep-wise
attention (Sec. 4.4), Fourier-nonlinearity MLPs over a multiset of homogeneous spaces (Sec. 4.3),
a class token in the trivial irreps and the invariantisation head (Sec. 4.5). Configurations follow
the seed's App. F; ``*_tiny`` exist so that the generic tests run every family.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from eqvit.geometry.domain import PointDomain, TokenMap, require_action, symmetry_subgroup
from eqvit.geometry.hexagonal import HexPatchGrid
from eqvit.geometry.square import square_grid
from eqvit.groups import FiniteGroup, resolve_group
from eqvit.models._checks import check_model_args
from eqvit.models._registry import register_model, strip_timm_kwargs
from eqvit.models._timm import entry_cfg, finish, pop_options, register_cfgs
from eqvit.models.vit import EquivariantViT, build_blocks
from eqvit.nn.activation import FourierActivation, homogeneous_fourier_basis
from eqvit.nn.irrep_attention import get_head_layout, head_basis, head_layout
from eqvit.nn.irrep_blocks import ClassTokenHead, TokenInvariants, irrep_block
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Block
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.posenc.registry import TokenLayout, build_posenc, posenc_name
from eqvit.nn.tokenizers.hexagonal import HexPatchTokenizer, SquareToHex
from eqvit.nn.tokenizers.square import SquarePatchTokenizer, square_patch_layout
from eqvit.utils import unknown_name_error

GRIDS = ("square", "hex")


def o2_group(group: str | FiniteGroup, offsets: np.ndarray, centers: np.ndarray, grid: str) -> FiniteGroup:
    """``group`` (a name, built-in or registered, or a :class:`~eqvit.groups.FiniteGroup`), checked to map the
    patch's pixels and the patch centres of the ``grid`` onto themselves (the G-patchified grid, Def. 3): any
    subgroup of the lattice's symmetry (D4 on the square grid, D6 on the hexagonal one) does."""
    G = resolve_group(group)
    require_action(G, offsets, f"the pixels of a {grid} patch")
    require_action(G, centers, f"the {grid} patch centres")
    return G


def subgroup_names(group: FiniteGroup) -> dict[str, np.ndarray]:
    """``{name: sorted element indices}`` of every subgroup of ``group``, by the names eqvit gives them
    (:func:`~eqvit.groups.planar.identify_planar_subgroup`: ``C2``, ``D1``, ``D1[45deg]``, ``D2[45deg]``, ...)."""
    names: dict[str, np.ndarray] = {}
    for idx in group.all_subgroups():
        names.setdefault(group.subgroup(idx).name, np.asarray(idx, dtype=np.int64))
    return names


def default_mlp_spaces(group: FiniteGroup, mlp_spaces: Sequence | None, copies: float) -> list:
    """The MLP G-set as ``(subgroup indices | "regular" | "trivial", count)`` pairs.

    Default: ``copies`` regular orbits (the seed's default, Sec. 5.1). In ``mlp_spaces`` a subgroup H
    (orbit G/H) is given by its name (``("C4", 1)``, ``("D2[45deg]", 1)``; the seed's Sec. 5.3 uses
    ``[("C4", n), ("D1", n), ("D2[45deg]", n)]`` for D4), by element indices, or as ``"regular"``
    (H = {e}) / ``"trivial"`` (H = G, one point).
    """
    if mlp_spaces is None:
        return [("regular", max(1, int(round(copies))))]
    out = []
    names = None
    for entry in mlp_spaces:
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"mlp_spaces: expected (subgroup, count) pairs, got {entry!r}")
        spec, count = entry
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"mlp_spaces: expected a count >= 0 for {spec!r}, got {count!r}")
        if isinstance(spec, str) and spec not in ("regular", "trivial"):
            names = names if names is not None else subgroup_names(group)
            if spec not in names:
                raise unknown_name_error(f"subgroup of {group.name} (mlp_spaces)", spec, ["regular", "trivial", *names])
            spec = names[spec]
        out.append((spec, int(count)))
    return out


def trivial_fraction(group: FiniteGroup, spaces: Sequence) -> float:
    """The fraction of trivial-irrep (A / A1) features in ``C(X, R)`` for the G-set ``spaces``
    (:func:`default_mlp_spaces` pairs): one per orbit, so ``#orbits / |X|`` (1/8 for D4's regular orbits)."""
    orbits = points = 0
    for spec, count in default_mlp_spaces(group, spaces, 1):
        if isinstance(spec, str):
            size = group.order if spec == "regular" else 1
        else:
            size = group.order // len(spec)
        orbits, points = orbits + count, points + count * size
    return orbits / points


def build_o2vit(
    *,
    grid: str = "square",
    group: str | FiniteGroup = "D4",
    attention: str = "coupled",
    posenc: str | PositionalScheme = "invariant_ape",
    in_chans: int = 3,
    num_classes: int = 38,
    img_size: int | None = 256,
    patch_size: int = 16,
    n_patch_side: int = 9,
    n_pixel_side: int = 9,
    embed_dim: int | None = None,
    regular_copies: int | None = None,
    multiplicities: dict[str, int] | None = None,
    depth: int = 6,
    num_heads: int = 3,
    irrep_heads: dict[str, int] | None = None,
    mlp_ratio: float = 2.0,
    mlp_spaces: Sequence | None = None,
    qkv_bias: bool = True,
    drop_rate: float = 0.0,
    attn_drop_rate: float = 0.1,
    drop_path_rate: float = 0.05,
    head_drop_rate: float = 0.1,
    fused_attn: bool = True,
    layout: str = "copies",
) -> EquivariantViT:
    """Build an O(2)-subgroup ViT.

    Args:
        grid: ``"square"`` (input ``[B, C, img_size, img_size]``, D4 family) or ``"hex"`` (patches of
            ``HexPatchGrid(n_patch_side, n_pixel_side)``, D6 family).
        img_size: the side of the square input images. Hexagonal models resample them onto their grid
            (:class:`~eqvit.nn.tokenizers.hexagonal.SquareToHex`, the first layer) and are exactly
            equivariant to the elements of ``group`` that map the square pixel grid onto itself (for D6 the
            half turn and the two axis reflections; ``model.group``); with ``img_size=None`` a hexagonal
            model takes the resampled input ``[B, C, P]`` on ``model.domain.points`` and is equivariant to
            all of ``group``.
        group: any group of 2x2 matrices that maps the grid's patches and patch centres onto themselves: a
            name (``"D4"``, ``"C4"``, ``"D2"``, ``"C2"``, ``"D1"``, ``"C1"`` on the square grid; ``"D6"``, ``"C6"``,
            ``"D3"``, ... on the hexagonal one; or one registered with :func:`eqvit.groups.register_group`) or a
            :class:`~eqvit.groups.FiniteGroup` (e.g. ``get_group("D4").subgroup(...)``); others are refused,
            naming the element that does not map the grid onto itself.
        attention: ``"coupled"`` (``num_heads`` heads), ``"irrepwise"`` (``num_heads`` per irrep, or
            ``irrep_heads``), ``"frames"`` (frames as heads in the frame basis, ``num_heads`` per frame) or a
            layout registered with :func:`eqvit.nn.irrep_attention.register_head_layout`.
        irrep_heads: irrep-wise attention only: ``{irrep name: heads}``, a number of heads per irrep
            (names ``G.irreps[i].name``; the seed's ``E`` stands for ``E1`` where that is the only 2-d
            irrep). The seed's Table 1 for C4 with ``regular_copies=4q``: ``{"A": 1, "B": 1, "E1": 2}``,
            four heads of 4q features. ValueError when a count does not divide the multiplicity.
            ``model.blocks[0].attn.head_dims`` lists the width of every head.
        posenc: a positional scheme registered for irrep-wise tokens (:mod:`eqvit.nn.posenc.registry`):
            ``"invariant_ape"`` (Sec. 4.2.2), ``"frame_rope"`` (frame RoPE on q, k in the frame basis, the patch
            centres as positions; needs copies of the regular representation) or ``"none"``; or a
            :class:`~eqvit.nn.posenc.PositionalScheme` built for these tokens.
        embed_dim: total token width, a multiple of ``|G|``: V is ``embed_dim / |G|`` copies of the
            regular representation (overrides ``regular_copies``). Without it, ``regular_copies``
            (default ``num_heads``) copies; or explicit ``multiplicities`` ``{irrep: C_rho}``.
        mlp_ratio: the MLP G-set is ``mlp_ratio * regular_copies`` regular orbits unless
            ``mlp_spaces`` lists ``(subgroup, count)`` pairs, the subgroup named (``"C2"``, ``"D1"``,
            ``"D2[45deg]"``; see :func:`subgroup_names`), as element indices, ``"regular"`` or ``"trivial"``.
        layout: token and MLP feature storage, ``"copies"`` or ``"components"`` (Schur block matmuls,
            :mod:`eqvit.nn.irrep_features`; the ViT-scale models of :mod:`eqvit.models.scale`).
    """
    config = dict(locals())
    check_model_args(config)
    if isinstance(group, FiniteGroup):
        config["group"] = group.name
    config["posenc"] = posenc_name(posenc)
    if grid not in GRIDS:
        raise unknown_name_error("grid", grid, GRIDS)
    layout_spec = get_head_layout(attention)  # ValueError naming the registered layouts
    if grid == "square":
        if img_size is None:
            raise ValueError("square models take images: pass img_size (the side of the square input)")
        offsets, centers, _ = square_patch_layout(img_size, patch_size)
    else:
        hexgrid = HexPatchGrid(n_patch_side, n_pixel_side)
        offsets, centers = hexgrid.pixel_offsets, hexgrid.patch_centers
    G = o2_group(group, offsets, centers, grid)
    if multiplicities is not None:
        ftype = FeatureType(G, multiplicities, layout=layout)
        copies = ftype.dim / G.order
        if embed_dim is not None and embed_dim != ftype.dim:
            raise ValueError(f"embed_dim {embed_dim} does not match the feature type {ftype}")
    else:
        if embed_dim is not None:  # the total width wins over regular_copies
            if embed_dim % G.order:
                raise ValueError(
                    f"embed_dim {embed_dim} must be a multiple of |{G.name}| = {G.order} "
                    "(copies of the regular representation)"
                )
            regular_copies = embed_dim // G.order
        elif regular_copies is None:
            regular_copies = num_heads
        ftype = FeatureType.regular(G, regular_copies, layout=layout)
        copies = regular_copies
    if irrep_heads is not None and not layout_spec.counts_per_irrep:
        raise ValueError(f"irrep_heads needs attention='irrepwise', got attention={attention!r}")
    heads = head_layout(ftype, irrep_heads if irrep_heads is not None else num_heads, attention)
    basis = head_basis(ftype, attention)
    act_type, act_basis, _ = homogeneous_fourier_basis(
        G, default_mlp_spaces(G, mlp_spaces, mlp_ratio * copies), layout=layout
    )

    symmetry, input_encoding = G, None
    if grid == "square":
        tokenizer = SquarePatchTokenizer(G, img_size, patch_size, in_chans, ftype)
        domain = square_domain(img_size)
        side = img_size // patch_size
        token_map = ((side, side), None, f"the {side}x{side} patch grid")
        reduction = token_spacing = patch_size
    else:
        tokenizer = HexPatchTokenizer(G, hexgrid, in_chans, ftype)
        shape, cells = hexgrid.patch_map()
        name = f"the {tokenizer.num_tokens} hexagonal patch centres in a {shape[0]}x{shape[1]} axial map"
        token_map = (shape, cells, name)
        spacing = hexgrid.spacing * math.sqrt(3)  # centre-to-centre distance in hexagonal pixels
        token_spacing = max(1, round(spacing))
        if img_size is None:
            domain = PointDomain(
                hexgrid.points,
                name=f"the hexagonal grid ({n_patch_side}, {n_pixel_side}) with {hexgrid.num_points} points",
            )
        else:
            input_encoding = SquareToHex(img_size, hexgrid.points)
            domain = square_domain(img_size)
            symmetry = symmetry_subgroup(G, domain.points)
            spacing *= input_encoding.scale  # in image pixels
        reduction = max(1, round(spacing))
    readout = TokenInvariants(ftype)
    head = ClassTokenHead(readout.num_features, num_classes, head_drop_rate)
    layout = TokenLayout(
        embed_dim=ftype.dim,
        num_heads=num_heads,
        head_dim=ftype.dim // num_heads,
        token_type=ftype,
        positions=tokenizer.centers,
        spacing=token_spacing,
    )
    scheme = build_posenc(posenc, layout)
    frame_rope = scheme.rotary_split  # the attention rotates q, k in the frame basis
    if scheme.is_rotary and frame_rope is None:
        raise ValueError(
            f"posenc {posenc_name(posenc)!r} rotates queries and keys outside the frame basis; the O(2) models' "
            "attention applies rotary schemes in the frame basis (rotary_split), e.g. 'frame_rope'"
        )

    def block_fn(index: int, rate: float) -> Block:
        return irrep_block(
            ftype,
            heads,
            FourierActivation(act_type, act_basis),
            rate,
            attn_drop_rate,
            qkv_bias,
            fused_attn,
            basis=basis,
            frame_rope=frame_rope,
        )

    return EquivariantViT(
        tokenizer=tokenizer,
        blocks=build_blocks(block_fn, depth, drop_path_rate),
        norm=IrrepLayerNorm(ftype),
        head=head,
        embed_dim=ftype.dim,
        posenc=scheme,
        readout=readout,
        input_encoding=input_encoding,
        domain=domain,
        group=symmetry,
        token_type=ftype,
        token_grid=TokenMap(tokenizer.centers, *token_map, reduction=reduction),
        in_chans=in_chans,
        out_chans=num_classes or head.num_features,
        drop_rate=drop_rate,
        config=config,
    )


def square_domain(img_size: int) -> PointDomain:
    """Fields on the ``img_size x img_size`` pixel centres (:func:`~eqvit.geometry.square_grid`)."""
    return PointDomain(
        square_grid(img_size, img_size), shape=(img_size, img_size), name=f"the {img_size}x{img_size} square grid"
    )


def _create(variant: str, **kwargs: Any) -> EquivariantViT:
    """Build, attach timm's ``pretrained_cfg`` and honour ``features_only`` (:mod:`eqvit.models._timm`)."""
    options = pop_options(kwargs)
    return finish(build_o2vit(**strip_timm_kwargs(kwargs)), variant, options)


def o2vit_cfg(img_size: int, map_side: int, num_classes: int) -> dict[str, Any]:
    """timm's config of an O(2) image classifier: ``[3, img_size, img_size]`` images, ``map_side^2`` maps."""
    return entry_cfg(
        (3, img_size, img_size),
        inputs="images",
        num_classes=num_classes,
        pool_size=(map_side, map_side),
        first_conv="tokenizer.embed.proj",
        classifier="head.fc",
    )


default_cfgs = register_cfgs(
    {
        "o2vit_square_tiny": o2vit_cfg(8, 2, 5),
        "o2vit_hex_tiny": o2vit_cfg(16, 3, 5),
        "o2vit_square_s": o2vit_cfg(256, 16, 38),
        "o2vit_hex_s": o2vit_cfg(224, 17, 38),
    }
)


@register_model
def o2vit_square_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Tiny D4 square model for tests: 8 x 8 images, 4 x 4 patches (4 tokens), depth 3, width 3 x regular.

    Depth 3: timm's feature tests ask for three feature levels (one per block); with one block the
    non-trivial query weights would not even reach the logits (the class token is trivial in the first
    block: an exactly zero gradient).
    """
    model_args = dict(
        grid="square", img_size=8, patch_size=4, depth=3, num_heads=3, regular_copies=3, num_classes=5, mlp_ratio=1.0
    )
    return _create("o2vit_square_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def o2vit_hex_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Tiny D6 hexagonal model for tests: 16 x 16 images resampled onto 7 hexagonal patches of 37 pixels,
    depth 3, width 3 x regular.

    37-pixel patches contain a free D6 orbit, so every irrep (A2 included) is read from the input.
    """
    model_args = dict(
        grid="hex",
        group="D6",
        img_size=16,
        n_patch_side=2,
        n_pixel_side=4,
        depth=3,
        num_heads=3,
        regular_copies=3,
        num_classes=5,
        mlp_ratio=1.0,
    )
    return _create("o2vit_hex_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def o2vit_square_s(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """The seed's square setting (App. F): D4, 256^2 images, 16^2 patches, depth 6, 3 coupled heads."""
    model_args = dict(grid="square", group="D4", img_size=256, patch_size=16, depth=6, num_heads=3, regular_copies=6)
    return _create("o2vit_square_s", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def o2vit_hex_s(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """The seed's hexagonal setting (App. F): D6, 224 x 224 images resampled onto 217 patches of 217 pixels,
    depth 6, 3 coupled heads."""
    model_args = dict(
        grid="hex", group="D6", img_size=224, n_patch_side=9, n_pixel_side=9, depth=6, num_heads=3, regular_copies=3
    )
    return _create("o2vit_hex_s", pretrained=pretrained, **dict(model_args, **kwargs))
