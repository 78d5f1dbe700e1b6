"""Model registry: ``eqvit.create_model`` / ``eqvit.list_models``, mirrored into timm's registry.

Entry points follow timm: ``fn(pretrained=False, **kwargs)`` built as
``model_args = dict(...)`` then ``_create(name, **dict(model_args, **kwargs))``.
"""

from __future__ import annotations

import fnmatch
import inspect
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from eqvit.utils import close_match_hint, unknown_name_error

_ENTRYPOINTS: dict[str, Callable[..., nn.Module]] = {}
# timm passes these to every entry point; eqvit has no pretrained weights.
TIMM_ONLY_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")
_UNEXPECTED = re.compile(r"^(?P<func>[\w.<>]+)\(\) got an unexpected keyword argument '(?P<key>\w+)'")


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register ``fn`` under its name in eqvit's registry and in timm's."""
    _ENTRYPOINTS[fn.__name__] = fn
    try:
        from timm.models import register_model as timm_register

        timm_register(fn)
    except ImportError:  # timm is a dependency, but the registry must not need it
        pass
    return fn


def strip_timm_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Drop timm's pretrained-config kwargs; refuse ``pretrained=True``."""
    if kwargs.pop("pretrained", False):
        raise ValueError("eqvit has no pretrained weights; use pretrained=False")
    return {k: v for k, v in kwargs.items() if k not in TIMM_ONLY_KWARGS}


CLASSIFIER_KWARGS = ("num_classes", "global_pool")


def refuse_classifier_kwargs(variant: str, kwargs: dict[str, Any]) -> None:
    """A dense model (one output field on the input's grid) has no classifier: ``num_classes`` or
    ``global_pool`` is a ValueError saying so and what to pass instead."""
    given = [key for key in CLASSIFIER_KWARGS if key in kwargs]
    if given:
        raise ValueError(
            f"{variant} is a dense model: it returns a field of out_chans channels on every point of its input "
            f"grid ([B, out_chans, *grid]), not class logits, so it takes no {' or '.join(given)}; pass "
            f"out_chans=N for N output channels, or use a classifier family (o2vit_*, platonic_image_*, "
            f"platonic_points_*) for logits"
        )


def list_models(pattern: str = "*", exclude_filters: str | Sequence[str] = (), inputs: str | None = None) -> list[str]:
    """Registered model names matching the fnmatch ``pattern``, sorted; without those matching a pattern of
    ``exclude_filters`` (as timm's ``list_models``); with ``inputs`` (``"images"``, ``"sphere"``, ``"points"``)
    only the models that take it."""
    from eqvit.models._timm import select

    return select(sorted(name for name in _ENTRYPOINTS if fnmatch.fnmatch(name, pattern)), exclude_filters, inputs)


def is_model(name: str) -> bool:
    return name in _ENTRYPOINTS


def _keyword_names(func: Any) -> list[str] | None:
    """The keyword arguments ``func`` accepts, or None when it takes ``**kwargs`` or cannot be inspected."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return sorted(p.name for p in params if p.kind in kinds and p.name != "self")


def _resolve(entrypoint: Callable[..., nn.Module], qualname: str) -> Any:
    """The function named ``qualname`` (``build_so3vit``, ``Baseline.__init__``) in the entry point's module."""
    obj: Any = sys.modules.get(entrypoint.__module__)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _unknown_kwarg(name: str, entrypoint: Callable[..., nn.Module], err: TypeError, kwargs: dict) -> ValueError | None:
    """A ValueError naming the unknown keyword (close match, valid keys), or None if ``err`` is not that."""
    match = _UNEXPECTED.match(str(err))
    if match is None or match["key"] not in kwargs:
        return None
    key = match["key"]
    func = _resolve(entrypoint, match["func"])
    valid = _keyword_names(func) if func is not None else None
    if not valid:
        return ValueError(f"unknown keyword argument {key!r} for model {name!r}")
    return ValueError(
        f"unknown keyword argument {key!r} for model {name!r}.{close_match_hint(key, valid)} Valid: {', '.join(valid)}"
    )


def load_weights(model: nn.Module, checkpoint_path: str | Path, name: str = "model") -> nn.Module:
    """Load an eqvit checkpoint (``last.safetensors``: ``model.*`` keys) or a plain state dict into ``model``.

    A checkpoint of a run restricted to subgroups (``model.relaxation``) restricts ``model`` the
    same way first; returns the (possibly restricted) model.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(checkpoint_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as fh:
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}
            metadata = fh.metadata() or {}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"checkpoint {path} is not a readable safetensors file: {err}") from None
    if any(k.startswith("model.") for k in tensors):
        state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    else:
        state = tensors
    try:
        relaxed = json.loads(metadata["eqvit"]).get("relaxed") if "eqvit" in metadata else None
        relaxed = relaxed or json.loads(metadata.get("eqvit_relaxed", "[]"))
    except (json.JSONDecodeError, AttributeError):
        relaxed = []
    if relaxed:
        from eqvit.models.restrict import restrict

        for subgroup in relaxed:
            model = restrict(model, subgroup)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"checkpoint {path} does not fit model {name!r}: {err}") from None
    return model


def create_model(
    name: str, pretrained: bool = False, checkpoint_path: str | Path | None = None, **kwargs: Any
) -> nn.Module:
    """Build the registered model ``name`` with keyword overrides of its defaults.

    An unknown keyword is a ValueError naming it, the closest valid one and all valid ones.
    ``checkpoint_path``: load weights from an eqvit checkpoint (``last.safetensors``) or an exported
    plain state dict (``eqvit export``).
    """
    if name not in _ENTRYPOINTS:
        raise unknown_name_error("model", name, list_models())
    entrypoint = _ENTRYPOINTS[name]
    try:
        model = entrypoint(pretrained=pretrained, **kwargs)
    except TypeError as err:
        unknown = _unknown_kwarg(name, entrypoint, err, kwargs)
        if unknown is None:
            raise
        raise unknown from None
    if checkpoint_path is not None:
        model = load_weights(model, checkpoint_path, name)
    return model
