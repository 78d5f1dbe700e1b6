"""ViT-S/B-sized equivariant models (timm names and widths) in the Schur ``components`` layout.

The O(2)-subgroup models store their tokens component-major (:mod:`eqvit.nn.irrep_features`), so
every linear is block matmuls at the Schur minimum (12/64 of timm's multiply-adds for D4, 6/16 for
C4, 20/144 for D6), the Fourier nonlinearity is a small per-token matmul around the GELU and the
norms stay in the irrep basis (:mod:`eqvit.nn.linear`, :mod:`eqvit.nn.activation`):

* ``o2vit_d4_small_patch16_224``: D4, 224^2 images, 16^2 patches (196 + 1 tokens), width 384
  (48 copies of the regular representation), 6 coupled heads, depth 12, MLP ratio 4;
* ``o2vit_d4_base_patch16_224``: the same at width 768 (96 copies), 12 heads;
* ``o2vit_c4_small_patch16_224``: C4 (rotations only) at ViT-S width (96 copies), 6 heads;
* ``o2vit_d6_small_hex``: D6 on the hexagonal grid ``HexPatchGrid(9, 9)``: 224^2 images resampled onto
  217 hexagonal patches of 217 pixels each (218 tokens with the class token, about ViT-S/16's 197), width
  384 (32 copies of the 12-dimensional regular representation), 8 coupled heads of 48 (6 heads do not
  divide the 32 copies), depth 12, MLP ratio 4.

The Platonic image models (D4 frames on square images, frames as heads, frame RoPE) take ViT-S/B
widths: ``platonic_d4_small_patch16_224`` (384 = 8 frames x 48 channels, one head per frame: 8 heads
of 48), ``platonic_d4_base_patch16_224`` (768 = 8 x 96, two heads per frame: 16 heads of 48). As in
the Platonic seed (Sec. 3, "we match the computational cost ... by equating our group-based parallelism
with standard multi-head attention"), the frames are heads: |G| x heads per frame is timm's head count
(6 for ViT-S, 12 for ViT-B) over |G| = 8, rounded, so a head keeps a size near timm's 64.

Every entry point has a ``*_tiny`` twin (``<family>_tiny`` with the same group, grid and layout at
test size) so that the generic registry tests run each family. ``pretrained_cfg`` carries timm's
fields (input size, mean and std, 1000 classes) with eqvit's image convention (data in [-1, 1], mean
= std = 0.5 per channel, so ``in_chans`` may change); eqvit has no pretrained weights.
"""

from __future__ import annotations

from typing import Any

from eqvit.models import o2vit as _o2vit
from eqvit.models import platonic as _platonic
from eqvit.models._registry import register_model
from eqvit.models._timm import register_cfgs
from eqvit.models.vit import EquivariantViT

_NO_DROP = dict(attn_drop_rate=0.0, drop_path_rate=0.0, drop_rate=0.0)


def _plat_cfg(img_size: int, map_side: int, num_classes: int) -> dict[str, Any]:
    return _platonic.platonic_cfg("images", (3, img_size, img_size), num_classes, (map_side, map_side))


default_cfgs = register_cfgs(
    {
        "o2vit_d4_small_patch16_224": _o2vit.o2vit_cfg(224, 14, 1000),
        "o2vit_d4_small_patch16_tiny": _o2vit.o2vit_cfg(16, 4, 5),
        "o2vit_d4_base_patch16_224": _o2vit.o2vit_cfg(224, 14, 1000),
        "o2vit_d4_base_patch16_tiny": _o2vit.o2vit_cfg(16, 4, 5),
        "o2vit_c4_small_patch16_224": _o2vit.o2vit_cfg(224, 14, 1000),
        "o2vit_c4_small_patch16_tiny": _o2vit.o2vit_cfg(16, 4, 5),
        "o2vit_d6_small_hex": _o2vit.o2vit_cfg(224, 17, 1000),
        "o2vit_d6_small_tiny": _o2vit.o2vit_cfg(16, 3, 5),
        "platonic_d4_small_patch16_224": _plat_cfg(224, 14, 1000),
        "platonic_d4_small_patch16_tiny": _plat_cfg(8, 4, 5),
        "platonic_d4_base_patch16_224": _plat_cfg(224, 14, 1000),
        "platonic_d4_base_patch16_tiny": _plat_cfg(8, 4, 5),
    }
)


def _o2(variant: str, model_args: dict[str, Any], kwargs: dict[str, Any]) -> EquivariantViT:
    args = dict(dict(layout="components", head_drop_rate=0.0, **_NO_DROP), **model_args)
    return _o2vit._create(variant, **dict(args, **kwargs))


def _plat(variant: str, model_args: dict[str, Any], kwargs: dict[str, Any]) -> EquivariantViT:
    args = dict(dict(kind="image", group="D4", in_chans=3, stream="fourier", **_NO_DROP), **model_args)
    return _platonic._create(variant, **dict(args, **kwargs))


_D4_S = dict(group="D4", img_size=224, patch_size=16, embed_dim=384, num_heads=6, depth=12, mlp_ratio=4.0)
# Depth 3: timm's feature tests ask for three feature levels (one per block).
_D4_TINY = dict(group="D4", img_size=16, patch_size=4, embed_dim=32, num_heads=2, depth=3, mlp_ratio=2.0)


@register_model
def o2vit_d4_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """D4 ViT-S/16: 224^2 images, width 384 (48 x regular), 6 coupled heads, depth 12, Schur layout."""
    return _o2("o2vit_d4_small_patch16_224", dict(_D4_S, num_classes=1000), dict(pretrained=pretrained, **kwargs))


@register_model
def o2vit_d4_small_patch16_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Test twin of ``o2vit_d4_small_patch16_224``: 16^2 images, 4^2 patches, width 32, depth 3."""
    return _o2("o2vit_d4_small_patch16_tiny", dict(_D4_TINY, num_classes=5), dict(pretrained=pretrained, **kwargs))


@register_model
def o2vit_d4_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """D4 ViT-B/16: 224^2 images, width 768 (96 x regular), 12 coupled heads, depth 12, Schur layout."""
    args = dict(_D4_S, embed_dim=768, num_heads=12, num_classes=1000)
    return _o2("o2vit_d4_base_patch16_224", args, dict(pretrained=pretrained, **kwargs))


@register_model
def o2vit_d4_base_patch16_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Test twin of ``o2vit_d4_base_patch16_224``: width 64, 4 heads, depth 3."""
    args = dict(_D4_TINY, embed_dim=64, num_heads=4, num_classes=5)
    return _o2("o2vit_d4_base_patch16_tiny", args, dict(pretrained=pretrained, **kwargs))


@register_model
def o2vit_c4_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """C4 ViT-S/16: width 384 (96 x regular; the complex-type E irrep as its two-matrix block), 6 heads."""
    args = dict(_D4_S, group="C4", num_classes=1000)
    return _o2("o2vit_c4_small_patch16_224", args, dict(pretrained=pretrained, **kwargs))


@register_model
def o2vit_c4_small_patch16_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Test twin of ``o2vit_c4_small_patch16_224``: width 32, depth 3."""
    args = dict(_D4_TINY, group="C4", num_classes=5)
    return _o2("o2vit_c4_small_patch16_tiny", args, dict(pretrained=pretrained, **kwargs))


@register_model
def o2vit_d6_small_hex(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """D6 hexagonal ViT-S: 224^2 images resampled onto ``HexPatchGrid(9, 9)`` (217 patches of 217 pixels),
    width 384 (32 x regular), 8 coupled heads, depth 12, MLP ratio 4, Schur layout."""
    args = dict(
        grid="hex",
        group="D6",
        img_size=224,
        n_patch_side=9,
        n_pixel_side=9,
        embed_dim=384,
        num_heads=8,
        depth=12,
        mlp_ratio=4.0,
    )
    return _o2("o2vit_d6_small_hex", dict(args, num_classes=1000), dict(pretrained=pretrained, **kwargs))


@register_model
def o2vit_d6_small_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Test twin of ``o2vit_d6_small_hex``: 16^2 images on 7 hexagonal patches of 37 pixels, width 48, depth 3."""
    args = dict(grid="hex", group="D6", img_size=16, n_patch_side=2, n_pixel_side=4, embed_dim=48, num_heads=2, depth=3)
    args = dict(args, num_classes=5, mlp_ratio=2.0)
    return _o2("o2vit_d6_small_tiny", args, dict(pretrained=pretrained, **kwargs))


_PLAT_S = dict(img_size=224, patch_size=16, embed_dim=384, num_heads=1, depth=12, mlp_ratio=4.0, num_classes=1000)
_PLAT_TINY = dict(img_size=8, patch_size=2, embed_dim=64, num_heads=1, depth=3, mlp_ratio=2.0, num_classes=5)


@register_model
def platonic_d4_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Platonic D4 image ViT-S/16: 8 frames x 48 channels (384), one head per frame (8 heads of 48), depth 12."""
    return _plat("platonic_d4_small_patch16_224", _PLAT_S, dict(pretrained=pretrained, **kwargs))


@register_model
def platonic_d4_small_patch16_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Test twin of ``platonic_d4_small_patch16_224``: 8^2 images, 2^2 patches, 8 x 8 channels, depth 3."""
    return _plat("platonic_d4_small_patch16_tiny", _PLAT_TINY, dict(pretrained=pretrained, **kwargs))


@register_model
def platonic_d4_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Platonic D4 image ViT-B/16: 8 frames x 96 channels (768), two heads per frame (16 heads of 48), depth 12."""
    args = dict(_PLAT_S, embed_dim=768, num_heads=2)
    return _plat("platonic_d4_base_patch16_224", args, dict(pretrained=pretrained, **kwargs))


@register_model
def platonic_d4_base_patch16_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """Test twin of ``platonic_d4_base_patch16_224``: 8 x 16 channels, 2 heads per frame, depth 3."""
    args = dict(_PLAT_TINY, embed_dim=128, num_heads=2)
    return _plat("platonic_d4_base_patch16_tiny", args, dict(pretrained=pretrained, **kwargs))
