"""Loaders for the Platonic seed's other datasets, each on small generated files in the real format."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eqvit.data import cifar10
from eqvit.train.config import load_config
from eqvit.train.engine import Trainer


def write_cifar(folder, per_batch: int = 6, batches: int = 2, seed: int = 0) -> dict:
    """CIFAR-10 binary batches: records of 1 label byte + R, G, B planes of 32 x 32 bytes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    names = [f"data_batch_{k}.bin" for k in range(1, batches + 1)] + ["test_batch.bin"]
    for name in names:
        labels = rng.integers(0, 10, per_batch).astype(np.uint8)
        images = rng.integers(0, 256, (per_batch, 3, 32, 32)).astype(np.uint8)
        records = np.concatenate([labels[:, None], images.reshape(per_batch, -1)], axis=1)
        (folder / name).write_bytes(records.tobytes())
        written[name] = (images, labels)
    (folder / "batches.meta.txt").write_text("\n".join(cifar10.CLASSES) + "\n\n")
    return written


def test_cifar10_binary_batches(tmp_path):
    written = write_cifar(tmp_path / "cifar-10-batches-bin")
    data = cifar10.cifar10_binary(tmp_path)  # the parent folder works too
    x, y = data["train"]
    assert x.shape == (12, 3, 32, 32) and x.dtype == np.uint8
    first, labels = written["data_batch_1.bin"]
    assert np.array_equal(x[:6], first) and np.array_equal(y[:6], labels)  # planes R, G, B, rows top down
    assert np.array_equal(data["test"][0], written["test_batch.bin"][0])
    assert cifar10.classes(tmp_path) == list(cifar10.CLASSES)


def test_cifar10_refuses_the_pickled_version_and_bad_files(tmp_path):
    (tmp_path / "py").mkdir()
    (tmp_path / "py" / "data_batch_1").write_bytes(b"\x80\x04 pickle")
    with pytest.raises(ValueError, match="pickled"):
        cifar10.cifar10_binary(tmp_path / "py")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "test_batch.bin").write_bytes(b"\x01" * 100)
    (tmp_path / "bad" / "data_batch_1.bin").write_bytes(b"\x01" * 100)
    with pytest.raises(ValueError, match="multiple of 3073 bytes"):
        cifar10.cifar10_binary(tmp_path / "bad")


def test_cifar10_config_trains_the_platonic_image_model(tmp_path):
    write_cifar(tmp_path / "bin", per_batch=8)
    cfg = load_config("configs/platonic_cifar10.yaml")
    cfg.data.root = str(tmp_path / "bin")
    cfg.data.batch_size, cfg.data.val_batch_size = 4, 8
    cfg.model.kwargs.update(embed_dim=48, depth=1)
    cfg.train.max_epochs, cfg.train.eval_every_epochs = None, None
    cfg.train.max_steps, cfg.train.eval_every = 2, 0
    summary = Trainer(cfg, progress=False, write=False).fit()
    assert summary["steps"] == 2 and 0 <= summary["metrics"]["accuracy"] <= 1


def write_scanobjectnn(folder, samples: int = 6, points: int = 64, seed: int = 0) -> dict:
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for prefix in ("training", "test"):
        data = rng.normal(size=(samples, points, 3)).astype(np.float32)
        label = rng.integers(0, 15, samples).astype(np.uint8)
        with h5py.File(folder / f"{prefix}_objectdataset_augmentedrot_scale75.h5", "w") as f:
            f["data"], f["label"] = data, label
            f["mask"] = np.zeros((samples, points), dtype=np.int8)
        written[prefix] = (data, label)
    return written


def test_scanobjectnn_h5_files(tmp_path):
    from eqvit.data.scanobjectnn import scanobjectnn_splits

    written = write_scanobjectnn(tmp_path / "main_split")
    splits = scanobjectnn_splits(tmp_path, num_points=32)  # finds main_split/
    pos, labels = splits["train"]
    assert pos.shape == (6, 32, 3) and labels.dtype == np.int64
    assert np.array_equal(pos, written["training"][0][:, :32]) and np.array_equal(labels, written["training"][1])
    with pytest.raises(ValueError, match="num_points 100"):
        scanobjectnn_splits(tmp_path, num_points=100)
    with pytest.raises(ValueError, match="no ScanObjectNN file"):
        scanobjectnn_splits(tmp_path, variant="objectdataset")


def test_scanobjectnn_config_trains_the_point_model(tmp_path):
    write_scanobjectnn(tmp_path / "h5")
    cfg = load_config("configs/platonic_scanobjectnn.yaml")
    cfg.data.root, cfg.data.num_points = str(tmp_path / "h5"), 16
    cfg.data.batch_size, cfg.data.val_batch_size = 3, 6
    cfg.model.kwargs.update(embed_dim=48, depth=1, group="T", num_points=16)
    cfg.train.max_epochs, cfg.train.eval_every_epochs = None, None
    cfg.train.max_steps, cfg.train.eval_every = 2, 0
    trainer = Trainer(cfg, progress=False, write=False)
    (pos, feat), _ = trainer.task.train_batch()
    assert pos.shape == (3, 16, 3) and torch.equal(feat, torch.ones(3, 16, 1))
    assert trainer.fit()["steps"] == 2
