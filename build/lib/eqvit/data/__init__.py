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
    "POINTCLOUD_CLASSES": "pointclouds",
    "PointCloudSet": "pointclouds",
    "PointCloudSplits": "pointclouds",
    "plot_pointclouds": "pointclouds",
    "pointcloud_splits": "pointclouds",
    "synthetic_pointclouds": "pointclouds",
}

__all__ = [
    "POINTCLOUD_CLASSES",
    "ImageFolderDataset",
    "PointCloudSet",
    "PointCloudSplits",
    "ShallowWaterConfig",
    "ShallowWaterData",
    "ShallowWaterStream",
    "SquareToHex",
    "ValidationSet",
    "image_folder_split",
    "latlon_points",
    "plot_pointclouds",
    "pointcloud_splits",
    "rotated_mnist",
    "synthetic_pointclouds",
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
