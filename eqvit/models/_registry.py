"""Model registry: ``eqvit.create_model`` / ``eqvit.list_models``, mirrored into timm's registry.

Entry points follow timm: ``fn(pretrained=False, **kwargs)`` built as
``model_args = dict(...)`` then ``_create(name, **dict(model_args, **kwargs))``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

from torch import nn

from eqvit.utils import unknown_name_error

_ENTRYPOINTS: dict[str, Callable[..., nn.Module]] = {}
# timm passes these to every entry point; eqvit has no pretrained weights.
TIMM_ONLY_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


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


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching the fnmatch ``pattern``, sorted."""
    return sorted(name for name in _ENTRYPOINTS if fnmatch.fnmatch(name, pattern))


def is_model(name: str) -> bool:
    return name in _ENTRYPOINTS


def create_model(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build the registered model ``name`` with keyword overrides of its defaults."""
    if name not in _ENTRYPOINTS:
        raise unknown_name_error("model", name, list_models())
    return _ENTRYPOINTS[name](pretrained=pretrained, **kwargs)
