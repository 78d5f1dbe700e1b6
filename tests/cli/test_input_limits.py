"""Huge values are refused up front with an estimate, and unreadable input files are named.

The machine's memory is fixed at 8 GiB here (``eqvit.utils.machine_memory``), so the refusals do not
depend on the machine the tests run on; each names what would not fit, its estimate and how it was made.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_one_paragraph, cli, write_config

import eqvit.utils
from eqvit.data.images import image_folder_split, read_image
from eqvit.geometry import icosphere
from eqvit.groups import get_group
from eqvit.train import engine
from eqvit.train.budget import build_within_memory
from eqvit.train.checkpoint import load_checkpoint
from eqvit.train.config import load_config
from eqvit.utils import MemoryBudgetError

GiB = 1 << 30


@pytest.fixture(autouse=True)
def small_machine(monkeypatch):
    monkeypatch.setattr(eqvit.utils, "machine_memory", lambda: 8 * GiB)


# ------------------------------------------------------------------------------------------------
# 12. sizes


@pytest.mark.parametrize(
    ("model", "data", "needles"),
    [
        ({"embed_dim": 1_000_000_000, "num_heads": 1}, {}, ["model 'so3vit_tiny'", "1000000000", "8.00 GiB"]),
        ({"depth": 1_000_000}, {}, ["depth 1,000,000", "a block", "x 16 bytes"]),
        ({"input_level": 12}, {}, ["icosphere level 12", "167,772,162 vertices"]),
        ({}, {"batch_size": 100_000_000}, ["at a batch of 100,000,000", "100,000,000 samples x", "blocks"]),
        ({}, {"num_val": 100_000_000}, ["data.num_val 100,000,000", "100,000,000 pairs x"]),
    ],
)
def test_a_run_that_cannot_fit_is_refused_with_its_estimate(
    capsys, tmp_path, cache_dir, model, data, needles, no_training
):
    config = write_config(tmp_path, cache_dir, model={"kwargs": model}, data=data)
    code, err = cli(capsys, "train", config, "--out", tmp_path / "out")
    assert code == 2
    assert_one_paragraph(err, "needs at least", "more than the 8.00 GiB of memory of this machine", *needles)
    assert not (tmp_path / "out").exists()


def test_a_model_is_refused_before_its_large_tensors_are_allocated(monkeypatch):
    def build(width: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width))

    allocated = []
    real_linear_init = torch.nn.Linear.__init__

    def linear_init(self, *args, **kwargs):
        real_linear_init(self, *args, **kwargs)
        allocated.append(self.weight.shape)

    monkeypatch.setattr(torch.nn.Linear, "__init__", linear_init)
    monkeypatch.setattr(eqvit.utils, "machine_memory", lambda: 100 * 2**20)  # one 4000 x 4000 weight fits
    with pytest.raises(MemoryBudgetError, match=r"one of shape \[4000, 4000\] of 61.04 MiB"):
        build_within_memory(build, "two linears", {"width": 4000})
    assert allocated == [(4000, 4000)]  # the second weight was refused, not allocated


def test_a_run_that_fits_is_not_refused(tmp_path, cache_dir):
    summary = engine.train(load_config(write_config(tmp_path, cache_dir)), out_dir=tmp_path / "out", progress=False)
    assert summary["steps"] == 2


def test_groups_caps_the_order_of_its_table(capsys):
    for name in ("D1000000", "C2000"):
        code, err = cli(capsys, "groups", name)
        assert code == 2
        assert_one_paragraph(err, "order <= 240", name)
    with pytest.raises(MemoryBudgetError, match=r"Cayley table of D1000000 \(order 2,000,000\)"):
        _ = get_group("D1000000").cayley


def test_an_icosphere_that_cannot_fit_is_refused():
    with pytest.raises(MemoryBudgetError, match=r"icosphere level 12 \(167,772,162 vertices\)"):
        icosphere(12)


def test_rollout_steps_are_bounded_before_anything_is_loaded(capsys, tmp_path, cache_dir, monkeypatch):
    import eqvit.train.config as config_module

    monkeypatch.setattr(config_module, "load_config", lambda path: pytest.fail("the config was read first"))
    config = write_config(tmp_path, cache_dir)
    code, err = cli(
        capsys, "eval", config, "--checkpoint", tmp_path / "x.safetensors", "--rollout", 10**12, "--out", tmp_path
    )
    assert code == 2
    assert_one_paragraph(err, "--rollout: expected at most 10000 steps", "1000000000000")


# ------------------------------------------------------------------------------------------------
# 2, 12, 15. image files that cannot be read are named


def _png(path, size: int = 16, seed: int = 0) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)


def test_a_truncated_image_is_named(tmp_path):
    path = tmp_path / "cut.png"
    _png(path, 64)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ValueError, match=f"cannot read image {path}: .*truncated"):
        read_image(path, 8)


def test_a_decompression_bomb_is_named(tmp_path, monkeypatch):
    from PIL import Image

    path = tmp_path / "bomb.png"
    _png(path, 100)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 100 x 100 is then more than twice the limit
    with pytest.raises(ValueError, match=f"image {path} is too large to decode safely"):
        read_image(path, 8)


def test_a_truncated_image_mid_run_keeps_the_last_step_and_is_named(capsys, tmp_path, cache_dir):
    root = tmp_path / "images"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(8):
            _png(root / c / f"{i}.png", 12, seed=10 * ord(c) + i)
    train, _, _ = image_folder_split(root, 0.25, seed=0)
    bad = train[-1][0]
    bad.write_bytes(bad.read_bytes()[:100])
    config = write_config(
        tmp_path,
        cache_dir,
        model={"name": "o2vit_square_tiny", "kwargs": {"in_chans": 3, "num_classes": 2}},
        data={"name": "image_folder", "root": str(root), "val_fraction": 0.25, "batch_size": 2, "val_batch_size": 4},
        train={"max_steps": 40},
    )
    out = tmp_path / "run"
    code, err = cli(capsys, "train", config, "--out", out)
    assert code == 2
    assert_one_paragraph(err, f"cannot read image {bad}")
    if "no checkpoint was written" in err:
        assert not (out / "last.safetensors").exists()
    else:
        step = load_checkpoint(out / "last.safetensors")[1]["step"]
        assert f"the checkpoint of step {step} (the last completed) is in {out / 'last.safetensors'}" in err


# ------------------------------------------------------------------------------------------------
# 15. h5py, UTF-8 and integer-parsing errors name their file


def test_a_file_that_is_not_hdf5_is_named(tmp_path):
    pytest.importorskip("h5py")
    from eqvit.data.scanobjectnn import read_h5

    path = tmp_path / "training_objectdataset_augmentedrot_scale75.h5"
    path.write_bytes(b"not an HDF5 file at all")
    with pytest.raises(ValueError, match=f"cannot read the ScanObjectNN file {path}"):
        read_h5(path)


def test_a_cifar_class_list_that_is_not_utf8_is_named(tmp_path):
    from eqvit.data.cifar10 import RECORD, classes

    (tmp_path / "test_batch.bin").write_bytes(bytes(RECORD))
    meta = tmp_path / "batches.meta.txt"
    meta.write_bytes(b"airplane\n\xff\xfe\n")
    with pytest.raises(ValueError, match=f"{meta}: not UTF-8 text"):
        classes(tmp_path)


@pytest.mark.parametrize(
    ("content", "needle"), [(b"\xff\xfe3\n", "not UTF-8 text"), (b"three\ngdb 1\n", "invalid literal for int")]
)
def test_a_qm9_file_that_cannot_be_parsed_is_named_with_its_path(tmp_path, content, needle):
    from eqvit.data.qm9 import read_xyz

    path = tmp_path / "dsgdb9nsd_000001.xyz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"QM9 .*file {path}.*{needle}"):
        read_xyz(path)


def test_a_file_that_is_not_rollout_maps_is_named(tmp_path):
    from eqvit.train.rollout import load_maps

    path = tmp_path / "maps.npz"
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match=f"{path} is not a file of rollout error maps"):
        load_maps(path)
