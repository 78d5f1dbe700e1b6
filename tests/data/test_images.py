"""Image data for the O(2)-subgroup ViTs: square -> hexagonal resampling, rotated MNIST, image folders."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eqvit.data.images import ImageFolderDataset, image_folder_split, rotate_images, rotated_mnist
from eqvit.geometry import HexPatchGrid, point_permutation, square_grid
from eqvit.nn.tokenizers.hexagonal import SquareToHex


def test_square_to_hex_is_exact_on_linear_images():
    """Bilinear interpolation reproduces affine functions: f(x, y) = 1 + 2x - 3y on both grids."""
    grid = HexPatchGrid(2, 3)
    transform = SquareToHex(32, grid.points).double()
    sq = square_grid(32, 32)
    radius = np.linalg.norm(grid.points, axis=1).max()
    scale = 31 / 2 / radius  # pixels per hexagonal unit
    image = torch.from_numpy(1 + 2 * sq[:, 0] - 3 * sq[:, 1]).reshape(1, 1, 32, 32)
    out = transform(image)[0, 0].numpy()
    expected = 1 + 2 * scale * grid.points[:, 0] - 3 * scale * grid.points[:, 1]
    assert out.shape == (grid.num_points,)
    np.testing.assert_allclose(out, expected, atol=1e-9)


def test_square_to_hex_commutes_with_shared_symmetries():
    """D2 = D4 n D6 (half turn, the x- and y-axis reflections) acts the same before and after."""
    grid = HexPatchGrid(2, 3)
    transform = SquareToHex(20, grid.points).double()
    sq, hx = square_grid(20, 20), grid.points
    image = torch.randn(2, 3, 20, 20, dtype=torch.float64)
    for g in [-np.eye(2), np.diag([1.0, -1.0]), np.diag([-1.0, 1.0])]:
        moved = torch.empty_like(image.flatten(2))
        moved[..., torch.as_tensor(point_permutation(sq, g))] = image.flatten(2)
        expected = torch.empty_like(transform(image))
        expected[..., torch.as_tensor(point_permutation(hx, g))] = transform(image)
        torch.testing.assert_close(transform(moved.reshape(image.shape)), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"expected images \[B, C, 20, 20\]"):
        transform(torch.randn(1, 3, 16, 16))


def test_rotate_images_quarter_turn_is_exact():
    image = torch.randn(1, 1, 8, 8, dtype=torch.float64)
    turned = rotate_images(image, torch.tensor([np.pi / 2], dtype=torch.float64))
    torch.testing.assert_close(turned, torch.rot90(image, 1, dims=(-2, -1)), atol=1e-6, rtol=0)


def test_rotated_mnist_split_and_nested_subsets():
    full = rotated_mnist(1.0, seed=0, img_size=32)
    tenth = rotated_mnist(0.1, seed=0, img_size=32)
    x, y = full["train"]
    assert x.shape == (4000, 1, 32, 32) and full["val"][0].shape == (1000, 1, 32, 32)
    assert x.min() >= -1 and x.max() <= 1 and x[0, 0, 0, 0] == -1  # background is -1
    assert tenth["train"][0].shape[0] == 400
    assert torch.equal(tenth["train"][0], x[:400]) and torch.equal(tenth["train"][1], y[:400])
    assert torch.equal(tenth["val"][1], full["val"][1])
    assert len(torch.unique(y)) == 10


def test_rotated_mnist_holdout_is_disjoint_from_train_and_val():
    full = rotated_mnist(1.0, seed=0, img_size=32)
    tenth = rotated_mnist(0.1, seed=0, img_size=32, holdout=1000)
    assert set(tenth) == {"train", "val", "holdout"}
    assert torch.equal(tenth["holdout"][0], full["train"][0][3000:])  # the end of the training pool
    assert torch.equal(tenth["train"][0], full["train"][0][:400])
    with pytest.raises(ValueError, match=r"0 <= holdout <= 0 .*got 1"):
        rotated_mnist(1.0, holdout=1)
    with pytest.raises(ValueError, match=r"0 <= holdout <= 3600 .*got 3601"):
        rotated_mnist(0.1, holdout=3601)


def test_image_folder_split_and_dataset(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in ["beach", "runway"]:
        (tmp_path / name).mkdir()
        for k in range(10):
            Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(tmp_path / name / f"{k}.png")
    train, val, classes = image_folder_split(tmp_path)
    assert classes == ["beach", "runway"] and len(train) == 16 and len(val) == 4
    assert sorted(label for _, label in val) == [0, 0, 1, 1]  # 20 % of each class
    assert not {p for p, _ in train} & {p for p, _ in val}
    grid = HexPatchGrid(1, 3)
    x, label = ImageFolderDataset(train, img_size=16)[0]
    assert label == train[0][1]
    assert x.shape == (3, 16, 16) and -1 <= x.min() and x.max() <= 1
    xh, _ = ImageFolderDataset(train, img_size=16, transform=SquareToHex(16, grid.points))[0]
    assert xh.shape == (3, grid.num_points)
