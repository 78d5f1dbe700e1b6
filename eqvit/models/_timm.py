"""timm's model metadata for eqvit's entry points: ``default_cfgs``, ``pretrained_cfg`` and ``features_only``.

Every family module registers one config per entry point through timm's own mechanism
(``default_cfgs = register_cfgs({name: entry_cfg(...)})`` before its ``@register_model`` functions:
:func:`register_cfgs` hands them to ``timm.models.generate_default_cfgs``), so
``timm.models.get_pretrained_cfg(name)`` knows a model's input size, pooled map size, first and last layer
without building it. eqvit has no weights: the configs describe the input a model takes, not a checkpoint.

Every family's ``_create`` ends in :func:`finish`: it attaches a ``pretrained_cfg`` (alias ``default_cfg``),
the registered config with what the built model says about itself (input size, classes, map size: keyword
overrides change them), so ``timm.data.resolve_data_config({}, model=m)`` and
``timm.data.create_transform(**cfg)`` give input the model accepts; with ``features_only=True`` it wraps an
image model in timm's ``FeatureGetterNet`` (the list of intermediate maps of
:meth:`~eqvit.models.vit.EquivariantViT.forward_intermediates`), as ``timm.create_model`` does for its ViTs.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

from timm.layers import register_notrace_module
from timm.models import generate_default_cfgs
from torch import nn

from eqvit.nn.irrep_attention import IrrepAttention
from eqvit.nn.irrep_blocks import IrrepMlp, TokenInvariants
from eqvit.nn.layers import InputCheck
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.platonic import FrameAttention, InvariantPoolHead, PlatonicMlp
from eqvit.nn.regular import FourierLayerNorm, RegularLayerNorm
from eqvit.nn.tokenizers.hexagonal import SquareToHex
from eqvit.nn.tokenizers.planar import PlanarTokenizer
from eqvit.nn.tokenizers.platonic import LiftedSquarePatchEmbed

# Keyword arguments timm's ``create_model`` passes for feature extraction and config overlays.
FEATURE_OPTIONS = ("features_only", "out_indices", "feature_cls", "output_fmt")
PLACEMENT = ("device", "dtype")  # applied to the built model, as timm's factory_kwargs place its models
DEFAULT_OUT_INDICES = 3  # timm's ViTs: the last three blocks
# eqvit's image datasets are scaled to [-1, 1] (eqvit.data.images).
IMAGE_MEAN = IMAGE_STD = 0.5
INPUT_KINDS = ("images", "sphere", "points")
# Leaves for torch.fx (timm's get_notrace_modules, which timm's FX feature extraction passes to the tracer):
# the input check, whose Python control flow reads tensor shapes, and the equivariant layers, whose forwards
# choose their structured products at construction and read their parameters through plain dict lookups;
# FX records one call of each, and traces the ViT around them (the residual stream, the blocks).
FX_LEAVES = (
    InputCheck,
    SquareToHex,
    PlanarTokenizer,
    LiftedSquarePatchEmbed,
    IrrepLayerNorm,
    RegularLayerNorm,
    FourierLayerNorm,
    IrrepAttention,
    FrameAttention,
    IrrepMlp,
    PlatonicMlp,
    TokenInvariants,
    InvariantPoolHead,
)
for _leaf in FX_LEAVES:
    register_notrace_module(_leaf)
_REGISTERED: dict[str, dict[str, Any]] = {}  # entry point -> its registered timm config (a copy)
_INPUTS: dict[str, str] = {}  # entry point -> what it takes (INPUT_KINDS)


def entry_cfg(
    input_size: tuple[int, ...],
    *,
    inputs: str,
    num_classes: int,
    first_conv: str,
    classifier: str,
    pool_size: tuple[int, int] | None = None,
    in_chans: int | None = None,
) -> dict[str, Any]:
    """One entry point's timm config: ``input_size`` (``(C, H, W)`` for images, ``(C, V)`` or ``(C, nlat, nlon)``
    on the sphere, ``(N, d)`` for point clouds, whose ``in_chans`` feature channels ride beside), the pooled map
    size of image models, the patch embedding and the final linear layer (the output projection of dense models,
    whose ``num_classes`` is 0). ``inputs`` is one of :data:`INPUT_KINDS` (:func:`list_models`' filter)."""
    if inputs not in INPUT_KINDS:
        raise ValueError(f"expected inputs in {INPUT_KINDS}, got {inputs!r}")
    chans = input_size[0] if in_chans is None else in_chans
    image = inputs == "images"
    return dict(
        url="",
        hf_hub_id="",
        inputs=inputs,
        input_size=tuple(input_size),
        fixed_input_size=True,
        interpolation="bilinear",
        crop_pct=1.0,
        crop_mode="center",
        mean=(IMAGE_MEAN if image else 0.0,) * chans,
        std=(IMAGE_STD if image else 1.0,) * chans,
        num_classes=num_classes,
        pool_size=pool_size,
        first_conv=first_conv,
        classifier=classifier,
        license="",
    )


def register_cfgs(cfgs: dict[str, dict[str, Any]]) -> Any:
    """Record :func:`entry_cfg` configs for eqvit and return timm's ``generate_default_cfgs`` of them: the module's
    ``default_cfgs``, which timm's ``register_model`` reads when the entry points are decorated."""
    timm_cfgs = {}
    for name, cfg in cfgs.items():
        cfg = dict(cfg)
        _INPUTS[name] = cfg.pop("inputs")
        _REGISTERED[name] = dict(cfg, architecture=name, tag="", custom_load=False)
        timm_cfgs[name] = cfg
    return generate_default_cfgs(timm_cfgs)


def registered_cfg(name: str) -> dict[str, Any]:
    """The registered config of entry point ``name`` (a copy); a KeyError naming the fix when it has none."""
    if name not in _REGISTERED:
        raise KeyError(
            f"no timm config is registered for {name!r}: add it to its module's "
            f"default_cfgs = register_cfgs({{{name!r}: entry_cfg(...)}}), above the entry points"
        )
    return dict(_REGISTERED[name])


def select(names: Sequence[str], exclude_filters: Sequence[str] = (), inputs: str | None = None) -> list[str]:
    """``names`` without those matching an fnmatch pattern of ``exclude_filters`` (timm's ``list_models``
    argument), and with ``inputs`` given only those that take it (:data:`INPUT_KINDS`)."""
    if inputs is not None and inputs not in INPUT_KINDS:
        raise ValueError(f"expected inputs in {INPUT_KINDS}, got {inputs!r}")
    patterns = [exclude_filters] if isinstance(exclude_filters, str) else list(exclude_filters)
    return [
        n
        for n in names
        if not any(fnmatch.fnmatch(n, p) for p in patterns) and (inputs is None or _INPUTS.get(n) == inputs)
    ]


def pop_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the feature-extraction options, ``pretrained_cfg_overlay`` and the placement (``device``,
    ``dtype``, which timm passes to every builder) from ``kwargs``; return them."""
    options = {name: kwargs.pop(name) for name in (*FEATURE_OPTIONS, *PLACEMENT) if name in kwargs}
    options["pretrained_cfg_overlay"] = kwargs.pop("pretrained_cfg_overlay", None)
    return options


def input_size(model: nn.Module) -> tuple[int, ...] | None:
    """The input without the batch axis, from ``model.domain``: ``(C, H, W)`` for images, ``(C, P)`` on a
    hexagonal grid, ``(C, V)`` on the icosphere, ``(C, nlat, nlon)`` on a lat-lon grid, and ``(N, 3)`` (the
    positions; the features are ``[N, C]``) for point clouds."""
    domain, chans = getattr(model, "domain", None), getattr(model, "in_chans", None)
    if domain is None or chans is None:
        return None
    if hasattr(domain, "shape"):
        return (int(chans), *(int(s) for s in domain.shape))
    return (int(domain.num_points), int(domain.dim))


def built_cfg(model: nn.Module, variant: str, overlay: dict[str, Any] | None = None) -> dict[str, Any]:
    """``variant``'s registered config with what the built ``model`` says about itself: its input size and
    layout, channels (mean and std), classes and map size; then timm's ``pretrained_cfg_overlay``."""
    cfg = registered_cfg(variant)
    chans = getattr(model, "in_chans", 0)
    grid = getattr(model, "token_grid", None)
    domain = getattr(model, "domain", None)
    cfg.update(
        input_size=input_size(model),
        mean=(cfg["mean"][0] if cfg["mean"] else 0.0,) * chans,
        std=(cfg["std"][0] if cfg["std"] else 1.0,) * chans,
        num_classes=getattr(model, "num_classes", 0),
        pool_size=None if grid is None else tuple(grid.shape),
        input_layout=domain.describe_input(chans) if domain is not None else "",
    )
    cfg.update(overlay or {})
    return cfg


def finish(model: nn.Module, variant: str, options: dict[str, Any]) -> nn.Module:
    """Attach ``pretrained_cfg`` / ``default_cfg`` (:func:`built_cfg`), place the model (timm's ``device`` and
    ``dtype``) and apply ``features_only``."""
    model.pretrained_cfg = model.default_cfg = built_cfg(model, variant, options.get("pretrained_cfg_overlay"))
    placement = {key: options[key] for key in PLACEMENT if options.get(key) is not None}
    if placement:
        model.to(**placement)
    if not options.get("features_only", False):
        extra = sorted(set(options) & {"out_indices", "feature_cls", "output_fmt"})
        if extra:
            raise ValueError(f"{', '.join(extra)} only apply with features_only=True")
        return model
    return feature_model(model, variant, options)


def feature_model(model: nn.Module, variant: str, options: dict[str, Any]) -> nn.Module:
    """``model`` wrapped in timm's ``FeatureGetterNet``: ``net(x)`` is the list of intermediate maps of the
    blocks ``out_indices`` (default the last three), layout as ``forward_intermediates(output_fmt=...)``."""
    if not hasattr(model, "feature_info"):
        raise ValueError(
            f"features_only=True needs an image model with patch tokens on a grid (o2vit_*, platonic_image_*), "
            f"got {variant}"
        )
    feature_cls = options.get("feature_cls", "getter")
    if feature_cls != "getter":
        raise ValueError(f"expected feature_cls 'getter' (intermediate maps of the blocks), got {feature_cls!r}")
    from timm.models._features import FeatureGetterNet

    out_indices = options.get("out_indices", min(DEFAULT_OUT_INDICES, len(model.blocks)))
    net = FeatureGetterNet(model, out_indices=out_indices, output_fmt=options.get("output_fmt", "NCHW"))
    cfg = {k: v for k, v in model.pretrained_cfg.items() if k not in ("num_classes", "classifier", "global_pool")}
    net.pretrained_cfg = net.default_cfg = cfg
    net.in_chans = model.in_chans
    return net
