"""Data sources. Submodules load on first use so ``import eqvit.data`` stays cheap."""

import importlib

_LAZY = {
    "ShallowWaterConfig": "shallow_water",
    "ShallowWaterData": "shallow_water",
    "ShallowWaterStream": "shallow_water",
    "ValidationSet": "shallow_water",
    "latlon_points": "shallow_water",
}

__all__ = ["ShallowWaterConfig", "ShallowWaterData", "ShallowWaterStream", "ValidationSet", "latlon_points"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
