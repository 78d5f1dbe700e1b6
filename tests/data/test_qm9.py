"""QM9 loading: the original .xyz format, qm9pack's CSVs, the cache, the Cormorant / EGNN split."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from helpers import write_xyz

from eqvit.data import qm9

HAS_QM9PACK = importlib.util.find_spec("qm9pack") is not None
# pytest.importorskip("qm9pack") would always skip: importing qm9pack needs pkg_resources (see eqvit.data.qm9).
needs_qm9pack = pytest.mark.skipif(not HAS_QM9PACK, reason="needs the qm9 extra (pip install qm9pack)")


def test_standard_split_sizes_and_seeded_permutation():
    sizes = qm9.split_sizes(qm9.NUM_MOLECULES)
    assert sizes == {"train": 100_000, "val": 17_748, "test": 13_083}
    ids = qm9.split_ids(qm9.NUM_MOLECULES, seed=0)
    assert {k: len(v) for k, v in ids.items()} == sizes
    every = np.concatenate(list(ids.values()))
    assert np.array_equal(np.sort(every), np.arange(qm9.NUM_MOLECULES))  # disjoint and complete
    again, other = qm9.split_ids(qm9.NUM_MOLECULES, seed=0), qm9.split_ids(qm9.NUM_MOLECULES, seed=1)
    assert all(np.array_equal(ids[k], again[k]) for k in ids)
    assert not np.array_equal(ids["test"], other["test"])


def test_xyz_folder_is_parsed_cached_and_split(tmp_path, monkeypatch):
    written = write_xyz(tmp_path / "xyz", 40)
    splits = qm9.qm9_splits(seed=0, root=tmp_path / "xyz", cache_dir=tmp_path / "cache")
    assert {k: len(v) for k, v in splits.items()} == qm9.split_sizes(40) == {"train": 31, "val": 5, "test": 4}
    arrays = splits["train"].arrays
    assert len(arrays) == 40 and arrays.offsets[-1] == sum(len(w["elements"]) for w in written)
    first = written[0]
    m = int(np.flatnonzero(arrays.index == first["index"])[0])
    a, b = arrays.offsets[m], arrays.offsets[m + 1]
    np.testing.assert_allclose(arrays.positions[a:b], first["pos"], atol=2e-6)  # *^ exponents read right
    assert arrays.atoms[a:b].tolist() == [qm9.ATOMIC_NUMBERS[e] for e in first["elements"]]
    # targets: mu is field 4 of the 16 after "gdb" (index, A, B, C, mu, ...), i.e. props[3]
    np.testing.assert_allclose(arrays.targets[m, qm9.TARGET_NAMES.index("mu")], first["props"][3], atol=1e-6)
    np.testing.assert_allclose(arrays.targets[m, qm9.TARGET_NAMES.index("cv")], first["props"][14], atol=1e-6)
    assert list((tmp_path / "cache").glob("*.npz"))
    # the second call reads the cache, not the files
    monkeypatch.setattr(qm9, "read_xyz_folder", lambda root: pytest.fail("the cache was not used"))
    again = qm9.qm9_splits(seed=0, root=tmp_path / "xyz", cache_dir=tmp_path / "cache")
    assert np.array_equal(again["test"].ids, splits["test"].ids)
    pos, atoms, targets = again["val"][0]
    assert pos.shape == (len(atoms), 3) and targets.shape == (12,)


def test_same_size_batches_and_element_index(tmp_path):
    write_xyz(tmp_path / "xyz", 30)
    train = qm9.qm9_splits(root=tmp_path / "xyz", cache_dir=tmp_path / "c")["train"]
    n = train.num_atoms
    rows = np.flatnonzero(n == n[0])
    pos, atoms = train.same_size_batch(rows)
    assert pos.shape == (len(rows), n[0], 3) and atoms.shape == (len(rows), n[0])
    assert set(qm9.element_index(atoms).ravel().tolist()) <= set(range(5))
    mixed = np.array([np.flatnonzero(n == c)[0] for c in np.unique(n)[:2]])
    with pytest.raises(ValueError, match="one atom count"):
        train.same_size_batch(mixed)
    with pytest.raises(ValueError, match="expected atoms among H, C, N, O, F"):
        qm9.element_index(np.array([6, 16]))


def test_bad_xyz_file_names_the_molecule(tmp_path):
    write_xyz(tmp_path / "xyz", 3)
    bad = tmp_path / "xyz" / "dsgdb9nsd_000002.xyz"
    lines = bad.read_text().splitlines()
    lines[2] = "C\t0.1\tnot-a-number\t0.3\t0.0"
    bad.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"dsgdb9nsd_000002\.xyz"):
        qm9.qm9_splits(root=tmp_path / "xyz", cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="not a folder"):
        qm9.qm9_splits(root=tmp_path / "missing", cache_dir=tmp_path / "c")


def test_bad_csv_row_names_the_molecule():
    row = {
        "XYZ_file": "dsgdb9nsd_000007.xyz",
        "Index": "7",
        "N_atoms": "2",
        "Elements": "['C','H']",
        "XYZ_Ang": "[[0.,1.,2.],[1.,2.]]",  # one coordinate missing
        **{col: "0.1" for _, col, _, _ in qm9.TARGETS},
    }
    with pytest.raises(ValueError, match=r"dsgdb9nsd_000007\.xyz .*expected 2 atoms"):
        qm9.parse_csv_row(row, "part1 line 8")
    index, pos, atoms, targets = qm9.parse_csv_row({**row, "XYZ_Ang": "[[0.,1.,2.],[1.,2.,3.]]"}, "x")
    assert index == 7 and pos.shape == (2, 3) and atoms.tolist() == [6, 1] and targets.shape == (12,)


@needs_qm9pack
def test_qm9pack_rows_are_the_characterised_set():
    files = qm9.qm9pack_files()
    rows = sum(f.read_bytes().count(b"\n") - 1 for f in files)  # one line per molecule after each header
    assert rows == qm9.NUM_MOLECULES
    arrays = qm9.read_qm9pack(limit=5)
    assert arrays.index.tolist() == [1, 2, 3, 4, 5]
    methane = arrays.atoms[arrays.offsets[0] : arrays.offsets[1]]
    assert sorted(methane.tolist()) == [1, 1, 1, 1, 6]  # molecule 1 is CH4
    np.testing.assert_allclose(arrays.targets[0, qm9.TARGET_NAMES.index("gap")], 0.5048)  # Ha
    np.testing.assert_allclose(arrays.targets[0, qm9.TARGET_NAMES.index("u0")], -40.47893)
