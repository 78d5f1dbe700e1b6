"""Data sources. Submodules load on first use so ``import eqvit.data`` stays cheap."""

import importlib

_LAZY = {
    "ImageFolderDataset": "images",
    "SquareToHex": "images",
    "image_folder_split": "images",
    "rotated_mnist": "images",
    "ShallowWaterConfig": "shallow_water",
    "ShallowWaterData": "shallow_water",
    "ShallowWaterStream": "shallow_water",
    "ValidationSet": "shallow_water",
    "latlon_points": "shallow_water",
}

__all__ = [
    "ImageFolderDataset",
    "ShallowWaterConfig",
    "ShallowWaterData",
    "ShallowWaterStream",
    "SquareToHex",
    "ValidationSet",
    "image_folder_split",
    "latlon_points",
    "rotated_mnist",
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
