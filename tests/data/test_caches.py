"""Caches are written safely and read warily, with the group's read access.

The QM9 ``.npz`` cache, the shallow-water validation cache and the QM9 training SMILES: a truncated,
empty or damaged file is rebuilt once with a warning naming it (never a traceback); two writers at
once do not collide; the files get the umask's mode (0644, or 0664 for a group-shared cache).
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import write_xyz

from eqvit.data import qm9
from eqvit.data.cache import CorruptCacheError, cached
from eqvit.data.qm9_generation import _load_smiles, _save_smiles
from eqvit.data.shallow_water import ShallowWaterConfig, ShallowWaterData
from eqvit.geometry import icosphere


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def flip_a_byte(path: Path) -> None:
    """One byte in the middle of the file changed: the size and the format's header stay right."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = [truncate, empty, flip_a_byte]


@pytest.fixture
def xyz(tmp_path):
    write_xyz(tmp_path / "xyz", 12)
    return tmp_path / "xyz"


def only_cache(folder: Path, pattern: str) -> Path:
    files = sorted(folder.glob(pattern))
    assert len(files) == 1, files
    return files[0]


def assert_same_arrays(a: qm9.QM9Arrays, b: qm9.QM9Arrays) -> None:
    for name in qm9.QM9Arrays.__dataclass_fields__:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_qm9_cache_is_rebuilt_once_with_a_warning(tmp_path, xyz, damage):
    fresh = qm9.load_qm9(xyz, tmp_path / "cache")
    path = only_cache(tmp_path / "cache", "*.npz")
    damage(path)
    with pytest.warns(UserWarning, match=rf"the QM9 cache {path} is unreadable .*building it again"):
        rebuilt = qm9.load_qm9(xyz, tmp_path / "cache")
    assert_same_arrays(rebuilt, fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt file is sound: read without a word
        assert_same_arrays(qm9.load_qm9(xyz, tmp_path / "cache"), fresh)


def test_a_qm9_cache_without_an_array_is_rebuilt(tmp_path, xyz):
    fresh = qm9.load_qm9(xyz, tmp_path / "cache")
    path = only_cache(tmp_path / "cache", "*.npz")
    with np.load(path) as z:
        kept = {k: z[k] for k in z.files if k != "targets"}
    with open(path, "wb") as fh:
        np.savez(fh, **kept)
    with pytest.warns(UserWarning, match="it lacks targets"):
        assert_same_arrays(qm9.load_qm9(xyz, tmp_path / "cache"), fresh)


def test_two_writers_of_the_qm9_cache_at_once_do_not_collide(tmp_path, xyz, monkeypatch):
    """Both builders are inside their write at the same moment (a barrier holds them there)."""
    barrier = threading.Barrier(2, timeout=30)
    real_savez = np.savez

    def savez_together(file, **arrays):
        barrier.wait()
        real_savez(file, **arrays)

    monkeypatch.setattr(qm9.np, "savez", savez_together)
    results, errors = [], []

    def load():
        try:
            results.append(qm9.load_qm9(xyz, tmp_path / "cache"))
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 2
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [only_cache(tmp_path / "cache", "*.npz").name]


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_caches_get_the_umask_mode(tmp_path, xyz, mask):
    previous = os.umask(mask)
    try:
        qm9.load_qm9(xyz, tmp_path / "qm9")
        data = ShallowWaterData(ShallowWaterConfig(seed=3, stats_samples=2))
        data.validation_set(1, seed=0, cache_dir=tmp_path / "swe")
        _save_smiles(tmp_path / "smiles.txt", {"C", "CC"})
    finally:
        os.umask(previous)
    expected = 0o666 & ~mask
    files = [*tmp_path.glob("qm9/*"), *tmp_path.glob("swe/*"), tmp_path / "smiles.txt"]
    assert len(files) == 3
    assert {p.name: p.stat().st_mode & 0o777 for p in files} == dict.fromkeys((p.name for p in files), expected)


@pytest.fixture(scope="module")
def swe():
    return ShallowWaterData(
        ShallowWaterConfig(seed=5, stats_samples=2), points=torch.from_numpy(np.array(icosphere(1).vertices))
    )


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_shallow_water_validation_cache_is_rebuilt(tmp_path, swe, damage):
    fresh = swe.validation_set(2, seed=1, cache_dir=tmp_path)
    damage(fresh.path)
    with pytest.warns(UserWarning, match=rf"validation cache {fresh.path} is unreadable"):
        rebuilt = swe.validation_set(2, seed=1, cache_dir=tmp_path)
    for name in ("spec_x", "spec_y", "x_grid", "y_grid", "x_points", "y_points", "mean", "std"):
        assert torch.equal(getattr(rebuilt, name), getattr(fresh, name)), name
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.path.name]


def test_the_smiles_cache_checks_its_lines(tmp_path):
    path = tmp_path / "smiles.txt"
    _save_smiles(path, {"C", "CCO", "c1ccccc1"})
    assert _load_smiles(path) == {"C", "CCO", "c1ccccc1"}
    path.write_text(path.read_text().rsplit("\n", 1)[0])  # the last line lost
    with pytest.raises(CorruptCacheError, match="do not match the checksum"):
        _load_smiles(path)
    with pytest.warns(UserWarning, match="unreadable"):
        assert cached(path, _load_smiles, lambda: {"N"}, _save_smiles, "SMILES") == {"N"}
    assert _load_smiles(path) == {"N"}
