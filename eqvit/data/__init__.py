"""Data sources. Submodules load on first use so ``import eqvit.data`` stays cheap."""

import importlib

_LAZY = {
    "ImageFolderDataset": "images",
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
    "QM9Dataset": "qm9",
    "load_qm9": "qm9",
    "qm9_splits": "qm9",
    "scanobjectnn_splits": "scanobjectnn",
    "cifar10_binary": "cifar10",
}

__all__ = [
    "POINTCLOUD_CLASSES",
    "ImageFolderDataset",
    "PointCloudSet",
    "PointCloudSplits",
    "QM9Dataset",
    "ShallowWaterConfig",
    "ShallowWaterData",
    "ShallowWaterStream",
    "ValidationSet",
    "cifar10_binary",
    "image_folder_split",
    "latlon_points",
    "load_qm9",
    "plot_pointclouds",
    "pointcloud_splits",
    "qm9_splits",
    "rotated_mnist",
    "scanobjectnn_splits",
    "synthetic_pointclouds",
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
