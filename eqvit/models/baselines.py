"""Non-equivariant baselines: torch-harmonics' S2Transformer and SO3ViT with a learned APE.

``s2transformer_*`` wrap :class:`torch_harmonics.examples.models.SphericalTransformer` as the
SO(3)-RoPE seed's baseline (Sec. 4.1, Appendix B, Table 1): DISCO-convolution patch embedding
onto the 64 x 128 equiangular grid (``scale_factor=1``, 8,192 tokens), additive spherical-harmonic
("spectral") position embedding, local neighborhood attention. The remaining settings follow
torch-harmonics' own shallow-water registry entry for the neighborhood S2Transformer
(``examples/model_registry.py``, ``s2ntransformer_sc2_layers4_e128``): instance norm, a (5, 4)
piecewise-linear DISCO kernel, bilinear (``ResampleS2``) upsampling before the decoder, no bias.
With them the parameter counts are the seed's Table 1 column (0.53 M, 2.12 M, 8.43 M, 4.22 M).

``theta_cutoff`` (the radius of the attention disk) is passed explicitly and stored in ``config``;
the default is the one SphericalTransformer's blocks use, ``(7 / sqrt(pi)) * pi / (nlat - 1)``:
a geodesic disk with the area of a 7 x 7 window of equatorial grid cells (``pi r^2 = 49 dtheta^2``),
0.197 rad = 11.3 deg on the 64 x 128 grid. (``NeighborhoodAttentionS2``'s own default, one
latitude spacing, is never reached through SphericalTransformer.) Near the poles the equiangular
grid crowds many more points into that disk, which is one reason the baseline is slow there.

``vit_ape_*`` is SO3ViT's tokenizer and ViT with a learned absolute position embedding instead of
SO(3)-RoPE: the non-equivariant ablation (``group`` is None).
"""

from __future__ import annotations

import copy
import copyreg
import functools
import inspect
import math
import warnings
from typing import Any

import torch
from torch import nn

from eqvit.geometry.domain import PointDomain, parameter_dtype
from eqvit.geometry.latlon import latlon_points
from eqvit.models._checks import check_model_args
from eqvit.models._registry import refuse_classifier_kwargs, register_model, strip_timm_kwargs
from eqvit.models._timm import entry_cfg, finish, pop_options, register_cfgs
from eqvit.models.so3vit import _create as create_so3vit
from eqvit.models.so3vit import so3vit_cfg
from eqvit.models.vit import EquivariantViT
from eqvit.utils import unknown_name_error

# SphericalTransformer arguments that the wrapper names itself (eqvit's names on the right).
_RENAMED = {"num_layers": "depth", "residual_prediction": "residual"}
_OWN = ("img_size", "grid", "in_chans", "out_chans", "embed_dim", "num_heads", "theta_cutoff")


@functools.cache
def _spherical_transformer() -> type[nn.Module]:
    """torch-harmonics' SphericalTransformer, imported on first use: torch-harmonics takes seconds
    to import, so ``import eqvit`` and ``eqvit list`` leave it until an ``s2transformer_*`` is built."""
    # Its neighborhood attention keeps its kernel, a registered torch custom op, as a module attribute;
    # pickle stores that op by the name it is defined under, so torch.save(model) works.
    from torch._library.custom_ops import CustomOpDef
    from torch_harmonics.examples.models import SphericalTransformer

    copyreg.pickle(CustomOpDef, _reduce_custom_op)
    return SphericalTransformer


def _reduce_custom_op(op: Any) -> tuple[Any, tuple[str, str]]:
    """Pickle a torch custom op (``torch.library.custom_op``) as a reference to the module-level name it is
    defined under; an op that is not found under that name cannot be pickled."""
    import pickle

    fn = op._init_fn
    module, name = fn.__module__, fn.__qualname__
    if _custom_op_by_name(module, name) is not op:
        raise pickle.PicklingError(f"cannot pickle the custom op {op!r}: {module}.{name} is another object")
    return _custom_op_by_name, (module, name)


def _custom_op_by_name(module: str, name: str) -> Any:
    """The object ``module.name`` (a custom op, when unpickled)."""
    import importlib

    return getattr(importlib.import_module(module), name, None)


@functools.cache
def _passthrough() -> tuple[str, ...]:
    """The SphericalTransformer arguments passed through unchanged (all it takes but ours)."""
    return tuple(
        name
        for name in inspect.signature(_spherical_transformer().__init__).parameters
        if name != "self" and name not in _RENAMED and name not in _OWN
    )


def default_theta_cutoff(nlat: int) -> float:
    """SphericalTransformer's block default: a disk with the area of 7 x 7 grid cells."""
    return (7.0 / math.sqrt(math.pi)) * math.pi / (nlat - 1)


class S2TransformerBaseline(nn.Module):
    """torch-harmonics' SphericalTransformer with eqvit's model interface (not equivariant).

    Input and output are ``[B, C, nlat, nlon]`` on torch-harmonics' ``grid``; ``domain`` checks
    the input and holds the grid points (``domain.points [nlat * nlon, 3]``).

    Args:
        img_size: input/output grid ``(nlat, nlon)``.
        grid: input/output latitude quadrature (``"equiangular"``: Clenshaw-Curtis, poles included).
        grid_internal: grid of the tokens; the seed's baseline puts them on an equiangular grid.
        scale_factor: DISCO downsampling of the encoder; 1 gives one token per grid point.
        embed_dim, depth, num_heads, mlp_ratio: transformer sizes.
        attention_mode: ``"neighborhood"`` (the seed's baseline) or ``"global"``.
        theta_cutoff: attention disk radius in radians; ``None`` -> :func:`default_theta_cutoff`
            of the token grid.
        residual: predict ``x + model(x)`` (SphericalTransformer's ``residual_prediction``).
        **kwargs: any other SphericalTransformer argument (``pos_embed``, ``drop_path_rate``, ...).
    """

    group = None  # the spectral position embedding and the lat-lon grid break every rotation
    output_action = "same"

    def __init__(
        self,
        *,
        img_size: tuple[int, int] = (64, 128),
        grid: str = "equiangular",
        grid_internal: str = "equiangular",
        scale_factor: int = 1,
        in_chans: int = 3,
        out_chans: int = 3,
        embed_dim: int = 128,
        depth: int = 4,
        num_heads: int = 1,
        mlp_ratio: float = 2.0,
        attention_mode: str = "neighborhood",
        pos_embed: str = "spectral",
        normalization_layer: str = "instance_norm",
        encoder_kernel_shape: tuple[int, int] = (5, 4),
        filter_basis_type: str = "piecewise linear",
        upsample_sht: bool = False,
        bias: bool = False,
        theta_cutoff: float | None = None,
        residual: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        passthrough = _passthrough()
        for name in kwargs:
            if name in _RENAMED:
                raise ValueError(f"pass {_RENAMED[name]}= instead of SphericalTransformer's {name}=")
            if name not in passthrough:
                raise unknown_name_error("S2Transformer argument", name, sorted(passthrough + _OWN))
        if not isinstance(img_size, (tuple, list)):
            raise ValueError(f"expected img_size to be a pair (nlat, nlon), got {img_size!r}")
        check_model_args(
            dict(
                img_size=img_size,
                scale_factor=scale_factor,
                in_chans=in_chans,
                out_chans=out_chans,
                embed_dim=embed_dim,
                depth=depth,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                theta_cutoff=theta_cutoff,
                **kwargs,
            )
        )
        nlat, nlon = (int(s) for s in img_size)
        if residual and in_chans != out_chans:
            raise ValueError(f"residual prediction needs in_chans == out_chans, got {in_chans} and {out_chans}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        token_nlat = (nlat - 1) // scale_factor + 1  # SphericalTransformer's own formula
        if theta_cutoff is None:
            theta_cutoff = default_theta_cutoff(token_nlat)
        self.config = dict(
            img_size=(nlat, nlon),
            grid=grid,
            grid_internal=grid_internal,
            scale_factor=scale_factor,
            in_chans=in_chans,
            out_chans=out_chans,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            attention_mode=attention_mode,
            pos_embed=pos_embed,
            normalization_layer=normalization_layer,
            encoder_kernel_shape=tuple(encoder_kernel_shape),
            filter_basis_type=filter_basis_type,
            upsample_sht=upsample_sht,
            bias=bias,
            theta_cutoff=float(theta_cutoff),
            residual=residual,
            **kwargs,
        )
        self.in_chans, self.out_chans = in_chans, out_chans
        self.embed_dim = self.num_features = embed_dim
        self.residual = residual
        # torch-harmonics precomputes its grids, quadrature and convolution tensors when it is built: that needs
        # real tensors, so the wrapped model is built on the CPU whatever the ambient device (e.g. a meta-device
        # build; timm's device= moves it afterwards).
        with warnings.catch_warnings(), torch.device("cpu"):
            self.domain = PointDomain(
                latlon_points(nlat, nlon, grid).numpy(), shape=(nlat, nlon), name=f"the {nlat}x{nlon} {grid} grid"
            )
            # torch-harmonics announces changed defaults (SHT truncation of the spectral position
            # embedding on equiangular grids); the new defaults are the ones we want.
            warnings.filterwarnings("ignore", message="Default .* changed in v0", category=UserWarning)
            self.model = _spherical_transformer()(
                img_size=(nlat, nlon),
                grid=grid,
                grid_internal=grid_internal,
                scale_factor=scale_factor,
                in_chans=in_chans,
                out_chans=out_chans,
                embed_dim=embed_dim,
                num_layers=depth,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                attention_mode=attention_mode,
                pos_embed=pos_embed,
                normalization_layer=normalization_layer,
                encoder_kernel_shape=tuple(encoder_kernel_shape),
                filter_basis_type=filter_basis_type,
                upsample_sht=upsample_sht,
                bias=bias,
                theta_cutoff=float(theta_cutoff),
                residual_prediction=residual,
                **kwargs,
            )
        self.num_tokens = self.model.h * self.model.w

    def __deepcopy__(self, memo: dict[int, Any]) -> S2TransformerBaseline:
        # torch-harmonics' NeighborhoodAttentionS2 keeps its kernel, a process-wide registered torch
        # CustomOpDef that cannot be copied, in ``attention_handle``: share it, copy the rest.
        # (assert_equivariant and EMA deep-copy models.)
        for module in self.modules():
            handle = vars(module).get("attention_handle")
            if handle is not None:
                memo.setdefault(id(handle), handle)
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        for key, value in vars(self).items():
            object.__setattr__(clone, key, copy.deepcopy(value, memo))
        return clone

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {name for name, _ in self.named_parameters() if "pos_embed" in name}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = parameter_dtype(self)
        self.domain.check(x, self.in_chans, dtype)
        if not len(x):  # torch's instance norm fails on an empty batch: the empty output, straight away
            return x.new_zeros(0, self.out_chans, *self.domain.shape, dtype=dtype)
        return self.model(x)


def _create_s2transformer(variant: str, **kwargs: Any) -> S2TransformerBaseline:
    refuse_classifier_kwargs(variant, kwargs)
    options = pop_options(kwargs)
    return finish(S2TransformerBaseline(**strip_timm_kwargs(kwargs)), variant, options)


def _create_vit_ape(variant: str, **kwargs: Any) -> EquivariantViT:
    """SO3ViT's builder and timm config with the learned APE (the registered ``vit_ape_*`` defaults)."""
    return create_so3vit(variant, **kwargs)


def s2transformer_cfg(nlat: int, nlon: int) -> dict[str, Any]:
    """timm's config of an S2Transformer on ``[3, nlat, nlon]`` lat-lon grids (a dense model)."""
    return entry_cfg(
        (3, nlat, nlon),
        inputs="sphere",
        num_classes=0,
        first_conv="model.encoder.conv",
        classifier="model.decoder.conv",
    )


default_cfgs = register_cfgs(
    {
        "s2transformer_tiny": s2transformer_cfg(16, 32),
        **{f"s2transformer_{size}": s2transformer_cfg(64, 128) for size in ("4x128", "4x256", "4x512", "8x256")},
        "vit_ape_tiny": so3vit_cfg(3),
        "vit_ape_4x128": so3vit_cfg(5),
    }
)


@register_model
def s2transformer_tiny(pretrained: bool = False, **kwargs: Any) -> S2TransformerBaseline:
    """Tiny S2Transformer for tests: 16 x 32 equiangular grid (512 tokens), depth 1, width 16."""
    model_args = dict(img_size=(16, 32), embed_dim=16, depth=1, num_heads=1)
    return _create_s2transformer("s2transformer_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def s2transformer_4x128(pretrained: bool = False, **kwargs: Any) -> S2TransformerBaseline:
    model_args = dict(depth=4, embed_dim=128)
    return _create_s2transformer("s2transformer_4x128", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def s2transformer_4x256(pretrained: bool = False, **kwargs: Any) -> S2TransformerBaseline:
    model_args = dict(depth=4, embed_dim=256)
    return _create_s2transformer("s2transformer_4x256", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def s2transformer_4x512(pretrained: bool = False, **kwargs: Any) -> S2TransformerBaseline:
    model_args = dict(depth=4, embed_dim=512)
    return _create_s2transformer("s2transformer_4x512", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def s2transformer_8x256(pretrained: bool = False, **kwargs: Any) -> S2TransformerBaseline:
    model_args = dict(depth=8, embed_dim=256)
    return _create_s2transformer("s2transformer_8x256", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_ape_tiny(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """``so3vit_tiny`` with a learned APE instead of SO(3)-RoPE (not equivariant)."""
    model_args = dict(input_level=3, patch_level=1, embed_dim=32, depth=2, num_heads=2, posenc="ape")
    return _create_vit_ape("vit_ape_tiny", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def vit_ape_4x128(pretrained: bool = False, **kwargs: Any) -> EquivariantViT:
    """``so3vit_4x128`` with a learned APE instead of SO(3)-RoPE (not equivariant)."""
    model_args = dict(depth=4, embed_dim=128, num_heads=4, posenc="ape")
    return _create_vit_ape("vit_ape_4x128", pretrained=pretrained, **dict(model_args, **kwargs))
