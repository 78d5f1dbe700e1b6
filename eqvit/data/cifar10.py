"""CIFAR-10 from its binary batches (``cifar-10-batches-bin``), for users who have them.

Each of ``data_batch_1.bin`` ... ``data_batch_5.bin`` (training, 10,000 images each) and
``test_batch.bin`` holds records of 3,073 bytes: one label byte (0..9), then 3,072 pixel bytes,
the 32 x 32 red plane, then green, then blue, rows top down. ``batches.meta.txt`` names the
classes. The python version of the dataset is pickled and is never read here (unpickling runs code).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

RECORD = 1 + 3 * 32 * 32
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN_FILES = tuple(f"data_batch_{k}.bin" for k in range(1, 6))
TEST_FILE = "test_batch.bin"


def read_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """``(images [S, 3, 32, 32] uint8, labels [S] int64)`` of one binary batch file."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % RECORD:
        raise ValueError(f"{path}: expected a multiple of {RECORD} bytes (label + 3x32x32 pixels), got {raw.size}")
    records = raw.reshape(-1, RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() >= len(CLASSES):
        raise ValueError(f"{path}: expected labels 0..9, got up to {labels.max()} (not a CIFAR-10 binary batch?)")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _folder(root: str | os.PathLike) -> Path:
    root = Path(root).expanduser()
    for folder in (root, root / "cifar-10-batches-bin"):
        if (folder / TEST_FILE).is_file():
            return folder
    if (root / "data_batch_1").is_file() or (root / "cifar-10-batches-py").is_dir():
        raise ValueError(
            f"{str(root)!r} holds the python (pickled) version of CIFAR-10, which eqvit does not read; "
            "download the binary version (cifar-10-binary.tar.gz, folder cifar-10-batches-bin)"
        )
    raise ValueError(
        f"no CIFAR-10 binary batches ({TEST_FILE}, data_batch_*.bin) in {str(root)!r} or its cifar-10-batches-bin/"
    )


def classes(root: str | os.PathLike) -> list[str]:
    """The class names from ``batches.meta.txt`` (the standard ten when it is absent)."""
    meta = _folder(root) / "batches.meta.txt"
    try:
        text = meta.read_text(encoding="utf-8") if meta.is_file() else ""
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{meta}: not UTF-8 text ({err.reason} at byte {err.start}); expected one class a line"
        ) from None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    return names if len(names) == len(CLASSES) else list(CLASSES)


def cifar10_binary(root: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train", "test"}``: ``(images [S, 3, 32, 32] uint8, labels [S])``; the training batches present
    (all five for the full 50,000) in order."""
    folder = _folder(root)
    train = [folder / name for name in TRAIN_FILES if (folder / name).is_file()]
    if not train:
        raise ValueError(f"{str(folder)!r} has {TEST_FILE} but no data_batch_*.bin training batches")
    parts = [read_batch(p) for p in train]
    return {
        "train": (np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])),
        "test": read_batch(folder / TEST_FILE),
    }
