"""ScanObjectNN (Uy et al. 2019) from its standard h5 files, for users who have them.

The release ships one pair of files per variant, e.g. ``main_split/training_objectdataset_augmentedrot_scale75.h5``
and ``main_split/test_objectdataset_augmentedrot_scale75.h5`` (PB_T50_RS, the hardest and most
reported variant, the default ``variant`` here), each holding ``data [S, 2048, 3]`` float32 points
and ``label [S]`` integers in 0..14 (and ``mask``, unused). Reading needs ``h5py`` (``pip install
'eqvit[scanobjectnn]'``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

CLASSES = (
    "bag", "bin", "box", "cabinet", "chair", "desk", "display", "door",
    "shelf", "table", "bed", "pillow", "sink", "sofa", "toilet",
)  # fmt: skip
DEFAULT_VARIANT = "objectdataset_augmentedrot_scale75"


def _h5py():
    try:
        import h5py
    except ModuleNotFoundError:
        raise ValueError(
            "reading ScanObjectNN needs h5py: pip install 'eqvit[scanobjectnn]' (or pip install h5py)"
        ) from None
    return h5py


def find_file(root: str | os.PathLike, split: str, variant: str = DEFAULT_VARIANT) -> Path:
    """``root/[main_split/]{training|test}_<variant>.h5``; a ValueError lists what ``root`` holds."""
    prefix = {"train": "training", "test": "test"}[split]
    root = Path(root).expanduser()
    for folder in (root, root / "main_split"):
        path = folder / f"{prefix}_{variant}.h5"
        if path.is_file():
            return path
    found = sorted(p.name for p in [*root.glob("*.h5"), *root.glob("main_split/*.h5")]) if root.is_dir() else []
    raise ValueError(
        f"no ScanObjectNN file {prefix}_{variant}.h5 in {str(root)!r} or its main_split/ "
        f"(found: {', '.join(found) or 'no .h5 files'})"
    )


def read_h5(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """``(points [S, P, 3] float32, labels [S] int64)`` of one ScanObjectNN h5 file."""
    h5py = _h5py()
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in ("data", "label") if k not in f]
            if missing:
                raise ValueError(f"{path}: expected datasets 'data' and 'label', missing {missing} (has {sorted(f)})")
            points = np.asarray(f["data"], dtype=np.float32)
            labels = np.asarray(f["label"]).reshape(-1).astype(np.int64)
    except (OSError, KeyError, TypeError) as err:  # h5py's messages name no file: not HDF5, truncated, damaged
        raise ValueError(f"cannot read the ScanObjectNN file {path}: {err}") from None
    if points.ndim != 3 or points.shape[-1] != 3 or len(points) != len(labels):
        raise ValueError(
            f"{path}: expected data [S, P, 3] and label [S], got {list(points.shape)} and {list(labels.shape)}"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise ValueError(f"{path}: expected labels in 0..{len(CLASSES) - 1}, got {labels.min()}..{labels.max()}")
    return points, labels


def scanobjectnn_splits(
    root: str | os.PathLike, variant: str = DEFAULT_VARIANT, num_points: int | None = 1024
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train", "test"}``: ``(points [S, num_points, 3], labels [S])``, the first ``num_points`` of each
    cloud (the files store them in farthest-point-like random order; ``None`` keeps all 2048)."""
    out = {}
    for split in ("train", "test"):
        points, labels = read_h5(find_file(root, split, variant))
        if num_points is not None:
            if num_points > points.shape[1]:
                raise ValueError(f"num_points {num_points} > the {points.shape[1]} points per cloud in the files")
            points = points[:, :num_points]
        out[split] = (points, labels)
    return out
