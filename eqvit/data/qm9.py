"""QM9: 130,831 small organic molecules (H, C, N, O, F; up to 29 atoms) with 12 DFT properties.

Two sources, one array layout:

- the PyPI package ``qm9pack`` (``pip install eqvit[qm9]``), whose wheel holds the characterised
  set as ``qm9pack/data/qm9_part{1,2,3}.csv``: exactly the 130,831 molecules the standard splits
  use (133,885 minus the 3,054 that failed the consistency check). The CSVs are found through
  ``importlib.util.find_spec`` and read as files: importing ``qm9pack`` itself needs
  ``pkg_resources``, which is gone from recent setuptools, so neither its ``get_data`` nor
  ``importlib.resources.files("qm9pack")`` (which imports the package) is used;
- ``root=``: a folder of the original ``dsgdb9nsd_*.xyz`` files (line 1 the atom count, line 2
  ``gdb <index>`` and the 15 properties, then one ``element x y z charge`` line per atom, in Å,
  with Fortran ``*^`` exponents).

Parsed once, the arrays are cached as one ``.npz`` (``cache_dir``, else ``$EQVIT_CACHE`` or
``~/.cache/eqvit``, under ``qm9/``): ``positions [A, 3]`` float64 in Å for all A atoms in molecule
order, ``atoms [A]`` atomic numbers, ``offsets [M + 1]`` (molecule m is atoms
``offsets[m]:offsets[m + 1]``), ``targets [M, 12]`` in the native units below and ``index [M]``
(the GDB-9 molecule number), with a SHA-256 of them: a cache that does not match it (truncated,
damaged) is built again with a warning. A bad row is a ValueError naming the molecule, a file that
is not UTF-8 text one naming the file.

:func:`qm9_splits` gives the Cormorant / EGNN split: 100,000 training, 17,748 validation and
13,083 test molecules, a permutation fixed by ``seed``.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.util
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eqvit.data.cache import CorruptCacheError, cached, digest
from eqvit.utils import atomic_write
from eqvit.utils import cache_dir as eqvit_cache_dir

# The 12 standard targets, in the column order of ``targets``: (name, csv column, xyz field, native unit).
# xyz fields count from 0 after the "gdb" tag: index, A, B, C, mu, alpha, homo, lumo, gap, r2, zpve, U0, U, H, G, Cv.
TARGETS: tuple[tuple[str, str, int, str], ...] = (
    ("mu", "Dipole_debye", 4, "D"),
    ("alpha", "Polarizability_bohr3", 5, "bohr^3"),
    ("homo", "HOMO_au", 6, "Ha"),
    ("lumo", "LUMO_au", 7, "Ha"),
    ("gap", "HOMO_LUMO_gap_au", 8, "Ha"),
    ("r2", "R2_bohr2", 9, "bohr^2"),
    ("zpve", "ZPVE_au", 10, "Ha"),
    ("u0", "InternalEnergy_0K_au", 11, "Ha"),
    ("u", "InternalEnergy_298K_au", 12, "Ha"),
    ("h", "Enthalphy_298K_au", 13, "Ha"),
    ("g", "GibbsFreeEnergy_298K_au", 14, "Ha"),
    ("cv", "Heatcapacity_Cv_cal_mol_K", 15, "cal/(mol K)"),
)
TARGET_NAMES = tuple(t[0] for t in TARGETS)
ELEMENTS = ("H", "C", "N", "O", "F")
ATOMIC_NUMBERS = {"H": 1, "C": 6, "N": 7, "O": 8, "F": 9}
NUM_MOLECULES = 130_831
SPLIT_SIZES = {"train": 100_000, "val": 17_748, "test": 13_083}
CSV_PARTS = ("qm9_part1.csv", "qm9_part2.csv", "qm9_part3.csv")
_CACHE_VERSION = 2  # the arrays and their SHA-256


@dataclass(frozen=True)
class QM9Arrays:
    """All molecules of one source, flat (see the module docstring)."""

    positions: np.ndarray  # [A, 3] float64, Å
    atoms: np.ndarray  # [A] int8 atomic numbers
    offsets: np.ndarray  # [M + 1] int64
    targets: np.ndarray  # [M, 12] float64, native units (TARGETS)
    index: np.ndarray  # [M] int64 GDB-9 numbers

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_atoms(self) -> np.ndarray:
        """Atoms per molecule ``[M]``."""
        return np.diff(self.offsets)


class QM9Dataset:
    """One split: molecules ``ids`` of ``arrays``.

    ``dataset[i]`` is ``(pos [n, 3] float64, atoms [n] int, targets [12] float64)``;
    :meth:`molecules` gives many at once, of the same atom count or not.
    """

    def __init__(self, arrays: QM9Arrays, ids: np.ndarray, name: str = "") -> None:
        self.arrays, self.ids, self.name = arrays, np.asarray(ids, dtype=np.int64), name

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"QM9Dataset({self.name!r}, {len(self)} molecules)"

    @property
    def num_atoms(self) -> np.ndarray:
        """Atoms per molecule of this split ``[len]``."""
        return self.arrays.num_atoms[self.ids]

    @property
    def targets(self) -> np.ndarray:
        """``[len, 12]`` in native units (columns :data:`TARGET_NAMES`)."""
        return self.arrays.targets[self.ids]

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m = self.ids[i]
        a, b = self.arrays.offsets[m], self.arrays.offsets[m + 1]
        return self.arrays.positions[a:b], self.arrays.atoms[a:b], self.arrays.targets[m]

    def same_size_batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pos [B, n, 3], atoms [B, n])`` of the molecules at ``rows`` (all with n atoms)."""
        n = self.num_atoms[rows]
        if len(rows) == 0 or (n != n[0]).any():
            raise ValueError(f"expected molecules of one atom count, got counts {sorted(set(n.tolist()))}")
        start = self.arrays.offsets[self.ids[rows]]
        gather = start[:, None] + np.arange(n[0])[None]
        return self.arrays.positions[gather], self.arrays.atoms[gather]


def split_sizes(num: int) -> dict[str, int]:
    """Cormorant / EGNN split sizes: 100,000 / 17,748 / 13,083 for the 130,831 molecules; for another
    count (a partial ``root``), the same fractions (test 10%, train 100,000 / 130,831, val the rest)."""
    if num == NUM_MOLECULES:
        return dict(SPLIT_SIZES)
    test = round(0.1 * num)
    train = min(num - test, round(num * SPLIT_SIZES["train"] / NUM_MOLECULES))
    return {"train": train, "val": num - train - test, "test": test}


def split_ids(num: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Molecule ids per split: one seeded permutation, cut into train, val, test."""
    perm = np.random.default_rng(seed).permutation(num)
    sizes = split_sizes(num)
    cut = np.cumsum([sizes["train"], sizes["val"]])
    return {"train": perm[: cut[0]], "val": perm[cut[0] : cut[1]], "test": perm[cut[1] :]}


# --------------------------------------------------------------------------------------- parsing


def qm9pack_files() -> list[Path]:
    """The three CSVs inside the installed ``qm9pack`` (without importing it; see the module docstring)."""
    spec = importlib.util.find_spec("qm9pack")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "QM9 needs the package qm9pack: pip install 'eqvit[qm9]' (or pip install qm9pack), or pass root= "
            "a folder of the original QM9 .xyz files"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    files = [folder / name for name in CSV_PARTS]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"qm9pack at {folder.parent} lacks {', '.join(missing)}; reinstall it")
    return files


def _float(text: str) -> float:
    return float(text.replace("*^", "e"))  # Fortran exponents in the .xyz files: 1.2*^-6


def parse_csv_row(row: dict[str, str], where: str) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """``(index, positions [n, 3], atomic numbers [n], targets [12])`` of one qm9pack CSV row."""
    name = row.get("XYZ_file") or "?"
    try:
        # Python-style lists: "['C','H']" and "[[0.59,0.,1.],...]" (numbers like "0." are not JSON)
        elements = [e.strip(" '\"") for e in row["Elements"].strip("[] ").split(",")]
        pos = np.array([_float(v) for v in row["XYZ_Ang"].replace("[", "").replace("]", "").split(",")])
        pos = pos.reshape(-1, 3) if pos.size % 3 == 0 else pos
        n = int(row["N_atoms"])
        targets = np.array([_float(row[col]) for _, col, _, _ in TARGETS])
        index = int(row["Index"])
        atoms = np.array([ATOMIC_NUMBERS[e] for e in elements], dtype=np.int8)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"QM9 molecule {name} ({where}): cannot parse the row: {type(err).__name__}: {err}") from None
    if pos.shape != (n, 3) or len(atoms) != n:
        raise ValueError(
            f"QM9 molecule {name} ({where}): expected {n} atoms with [{n}, 3] positions, got {len(atoms)} "
            f"elements and positions of shape {list(pos.shape)}"
        )
    if not (np.isfinite(pos).all() and np.isfinite(targets).all()):
        raise ValueError(f"QM9 molecule {name} ({where}): non-finite positions or properties")
    return index, pos, atoms, targets


def read_xyz(path: Path) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """``(index, positions [n, 3], atomic numbers [n], targets [12])`` of one original QM9 ``.xyz`` file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"QM9 file {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        n = int(lines[0])
        props = lines[1].split()
        if props[0] != "gdb" or len(props) != 17:
            raise ValueError(f"line 2: expected 'gdb' and 16 numbers, got {len(props)} fields")
        index = int(props[1])
        values = [_float(v) for v in props[1:]]
        targets = np.array([values[field] for _, _, field, _ in TARGETS])
        rows = [line.split() for line in lines[2 : 2 + n]]
        if len(rows) != n or any(len(r) < 4 for r in rows):
            raise ValueError(f"expected {n} atom lines 'element x y z charge' after line 2")
        atoms = np.array([ATOMIC_NUMBERS[r[0]] for r in rows], dtype=np.int8)
        pos = np.array([[_float(v) for v in r[1:4]] for r in rows], dtype=np.float64)
    except (IndexError, KeyError, ValueError) as err:
        raise ValueError(f"QM9 molecule file {path}: cannot parse it: {type(err).__name__}: {err}") from None
    if not (np.isfinite(pos).all() and np.isfinite(targets).all()):
        raise ValueError(f"QM9 molecule file {path}: non-finite positions or properties")
    return index, pos, atoms, targets


def _iter_csv(files: Sequence[Path], limit: int | None) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    count = 0
    csv.field_size_limit(1 << 24)
    for path in files:
        with open(path, newline="", encoding="utf-8") as fh:
            try:
                for line, row in enumerate(csv.DictReader(fh), start=2):
                    if limit is not None and count >= limit:
                        return
                    yield parse_csv_row(row, f"{path.name} line {line}")
                    count += 1
            except UnicodeDecodeError as err:
                raise ValueError(f"QM9 file {path}: not UTF-8 text ({err.reason})") from None
            except csv.Error as err:
                raise ValueError(f"QM9 file {path}: not a readable CSV ({err})") from None


def _assemble(molecules: Iterable[tuple[int, np.ndarray, np.ndarray, np.ndarray]]) -> QM9Arrays:
    index, pos, atoms, targets = [], [], [], []
    for i, p, a, t in molecules:
        index.append(i)
        pos.append(p)
        atoms.append(a)
        targets.append(t)
    if not index:
        raise ValueError("no QM9 molecules were read")
    order = np.argsort(index, kind="stable")  # molecule order = GDB-9 number, whatever the file order
    counts = np.array([len(atoms[k]) for k in order])
    return QM9Arrays(
        positions=np.concatenate([pos[k] for k in order]),
        atoms=np.concatenate([atoms[k] for k in order]),
        offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        targets=np.stack([targets[k] for k in order]),
        index=np.asarray(index, dtype=np.int64)[order],
    )


def read_qm9pack(limit: int | None = None) -> QM9Arrays:
    """Parse qm9pack's CSVs (the first ``limit`` rows only, when given)."""
    return _assemble(_iter_csv(qm9pack_files(), limit))


def read_xyz_folder(root: str | os.PathLike) -> QM9Arrays:
    """Parse every ``*.xyz`` file in ``root``."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ValueError(f"QM9 root {str(root)!r} is not a folder (expected the original dsgdb9nsd_*.xyz files)")
    files = sorted(root.glob("*.xyz"))
    if not files:
        raise ValueError(f"QM9 root {str(root)!r} holds no .xyz files")
    return _assemble(read_xyz(f) for f in files)


# --------------------------------------------------------------------------------------- cache


def _source_key(root: str | os.PathLike | None) -> str:
    """A name for the cache file that changes when the source does."""
    if root is None:
        stats = [(f.name, f.stat().st_size) for f in qm9pack_files()]
        return "qm9pack-" + hashlib.sha1(repr(stats).encode()).hexdigest()[:12]
    files = sorted(Path(root).expanduser().glob("*.xyz"))
    stats = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return "xyz-" + hashlib.sha1(repr((str(Path(root).resolve()), stats)).encode()).hexdigest()[:12]


def load_qm9(root: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None) -> QM9Arrays:
    """All molecules (qm9pack, or the ``.xyz`` files in ``root``), parsed once and then read from the cache
    (:func:`eqvit.data.cache.cached`: verified by a checksum, rebuilt with a warning when unreadable)."""
    folder = Path(cache_dir).expanduser() if cache_dir is not None else eqvit_cache_dir() / "qm9"
    path = folder / f"{_source_key(root)}-v{_CACHE_VERSION}.npz"
    build = read_qm9pack if root is None else functools.partial(read_xyz_folder, root)
    return cached(path, _load_arrays, build, _save_arrays, "QM9")


_ARRAY_NAMES = tuple(QM9Arrays.__dataclass_fields__)


def _save_arrays(path: Path, arrays: QM9Arrays) -> None:
    values = {name: getattr(arrays, name) for name in _ARRAY_NAMES}
    values["sha256"] = np.array(digest(values.items()))

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.savez would add ".npz" to a name
            np.savez(fh, **values)

    atomic_write(path, write)


def _load_arrays(path: Path) -> QM9Arrays:
    """The cached arrays, checked against the checksum stored with them (CorruptCacheError otherwise)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [name for name in (*_ARRAY_NAMES, "sha256") if name not in z.files]
            if missing:
                raise CorruptCacheError(f"it lacks {', '.join(missing)}")
            values = {name: z[name] for name in _ARRAY_NAMES}
            recorded = str(z["sha256"])
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        if isinstance(err, CorruptCacheError):
            raise
        raise CorruptCacheError(f"{type(err).__name__}: {err}") from None
    if digest(values.items()) != recorded:
        raise CorruptCacheError("its contents do not match the checksum stored with them")
    return QM9Arrays(**values)


def qm9_splits(
    seed: int = 0, root: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
) -> dict[str, QM9Dataset]:
    """``{"train", "val", "test"}`` :class:`QM9Dataset` s: 100,000 / 17,748 / 13,083 molecules (the
    Cormorant / EGNN split), a permutation fixed by ``seed``. ``root``: a folder of the original
    ``.xyz`` files instead of qm9pack; ``cache_dir``: where the parsed arrays are kept."""
    arrays = load_qm9(root, cache_dir)
    return {name: QM9Dataset(arrays, ids, name) for name, ids in split_ids(len(arrays), seed).items()}


def target_columns(names: Sequence[str]) -> list[int]:
    """Columns of ``targets`` for the target ``names``; an unknown name lists the valid ones."""
    from eqvit.utils import unknown_name_error

    out = []
    for name in names:
        if name not in TARGET_NAMES:
            raise unknown_name_error("QM9 target", name, TARGET_NAMES)
        out.append(TARGET_NAMES.index(name))
    return out


def element_index(atoms: np.ndarray) -> np.ndarray:
    """Atomic numbers -> indices into :data:`ELEMENTS` (H 0, C 1, N 2, O 3, F 4)."""
    table = np.full(128, -1, dtype=np.int64)
    for k, e in enumerate(ELEMENTS):
        table[ATOMIC_NUMBERS[e]] = k
    atoms = np.asarray(atoms, dtype=np.int64)
    out = table[np.clip(atoms, 0, len(table) - 1)]
    if (out < 0).any() or (atoms >= len(table)).any():
        raise ValueError(
            f"expected atoms among {', '.join(ELEMENTS)}, got atomic numbers {sorted(set(atoms.tolist()))}"
        )
    return out
