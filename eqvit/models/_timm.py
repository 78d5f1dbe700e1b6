"""timm's model metadata for eqvit's entry points: ``pretrained_cfg`` and ``features_only``.

Every family's ``_create`` ends in :func:`finish`: it attaches a ``pretrained_cfg`` (alias
``default_cfg``) that describes the model as built (eqvit has no weights, so the config describes the
input the model takes, not a checkpoint), so ``timm.data.resolve_data_config({}, model=m)`` and
``timm.data.create_transform(**cfg)`` give input the model accepts; and with ``features_only=True``
it wraps an image model in timm's ``FeatureGetterNet`` (the list of intermediate maps of
:meth:`~eqvit.models.vit.EquivariantViT.forward_intermediates`), as ``timm.create_model`` does for
its ViTs.
"""

from __future__ import annotations

from typing import Any

from torch import nn

# Keyword arguments timm's ``create_model`` passes for feature extraction and config overlays.
FEATURE_OPTIONS = ("features_only", "out_indices", "feature_cls", "output_fmt")
PLACEMENT = ("device", "dtype")  # applied to the built model, as timm's factory_kwargs place its models
DEFAULT_OUT_INDICES = 3  # timm's ViTs: the last three blocks
# eqvit's image datasets are scaled to [-1, 1] (eqvit.data.images).
IMAGE_MEAN = IMAGE_STD = 0.5


def pop_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the feature-extraction options, ``pretrained_cfg_overlay`` and the placement (``device``,
    ``dtype``, which timm passes to every builder) from ``kwargs``; return them."""
    options = {name: kwargs.pop(name) for name in (*FEATURE_OPTIONS, *PLACEMENT) if name in kwargs}
    options["pretrained_cfg_overlay"] = kwargs.pop("pretrained_cfg_overlay", None)
    return options


def input_size(model: nn.Module) -> tuple[int, ...] | None:
    """The input without the batch axis, from ``model.domain``: ``(C, H, W)`` for square images, ``(C, P)``
    on the hexagonal grid, ``(C, V)`` on the icosphere, ``(C, nlat, nlon)`` on a lat-lon grid, and
    ``(N, 3)`` (the positions; the features are ``[N, C]``) for point clouds."""
    domain, chans = getattr(model, "domain", None), getattr(model, "in_chans", None)
    if domain is None or chans is None:
        return None
    if hasattr(domain, "shape"):
        return (int(chans), *(int(s) for s in domain.shape))
    return (int(domain.num_points), int(domain.dim))


def model_cfg(
    model: nn.Module,
    variant: str,
    *,
    first_conv: str,
    classifier: str,
    image: bool,
    overlay: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """timm's pretrained-config fields for ``model`` as built (``input_size`` from :func:`input_size`).

    Args:
        first_conv, classifier: module names of the patch embedding and of the final linear layer
            (the output projection of dense models, whose ``num_classes`` is 0).
        image: images get timm's image fields for [-1, 1] data (mean = std = 0.5, bilinear, no crop);
            other inputs mean 0, std 1.
        overlay: entries that replace the derived ones (timm's ``pretrained_cfg_overlay``).
    """
    chans = getattr(model, "in_chans", 0)
    domain = getattr(model, "domain", None)
    cfg = dict(
        url="",
        hf_hub_id="",
        architecture=variant,
        tag="",
        custom_load=False,
        input_size=input_size(model),
        fixed_input_size=True,
        interpolation="bilinear",
        crop_pct=1.0,
        crop_mode="center",
        mean=(IMAGE_MEAN if image else 0.0,) * chans,
        std=(IMAGE_STD if image else 1.0,) * chans,
        num_classes=getattr(model, "num_classes", 0),
        pool_size=None,
        first_conv=first_conv,
        classifier=classifier,
        input_layout=domain.describe_input(chans) if domain is not None else "",
        license="",
    )
    cfg.update(overlay or {})
    return cfg


def finish(model: nn.Module, variant: str, options: dict[str, Any], **cfg: Any) -> nn.Module:
    """Attach ``pretrained_cfg`` / ``default_cfg`` (:func:`model_cfg` with ``cfg``) and apply ``features_only``."""
    model.pretrained_cfg = model.default_cfg = model_cfg(
        model, variant, overlay=options.get("pretrained_cfg_overlay"), **cfg
    )
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
