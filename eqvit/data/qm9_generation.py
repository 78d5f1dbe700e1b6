"""QM9 for molecule generation: batches of molecules of one atom count, the atom-count distribution, and the
training set's SMILES (for novelty).

Molecules come from :func:`eqvit.data.qm9.qm9_splits` (the Cormorant / EGNN split): positions in Å and the atom
types as one-hot rows over H, C, N, O, F (:data:`eqvit.data.qm9.ELEMENTS`), with every hydrogen explicit.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import torch

from eqvit.data.cache import CorruptCacheError, cached
from eqvit.data.qm9 import ELEMENTS, QM9Dataset, element_index
from eqvit.utils import atomic_write

ROTATIONS = ("none", "z", "so3")


def molecules_batch(split: QM9Dataset, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(positions [B, n, 3] float64, one-hot types [B, n, 5] float32)`` of the molecules at ``rows`` (one count)."""
    pos, atoms = split.same_size_batch(rows)
    return pos, np.eye(len(ELEMENTS), dtype=np.float32)[element_index(atoms)]


def molecule(split: QM9Dataset, row: int) -> tuple[np.ndarray, np.ndarray]:
    """``(positions [n, 3], types [n])`` (type indices) of one molecule."""
    pos, atoms, _ = split[row]
    return np.asarray(pos, dtype=np.float64), element_index(atoms)


def random_rotations(mode: str, n: int, generator: torch.Generator) -> torch.Tensor | None:
    """``[n, 3, 3]`` float64: Haar-uniform (``"so3"``), about the z axis (``"z"``), or None (``"none"``)."""
    if mode not in ROTATIONS:
        raise ValueError(f"expected a rotation mode among {', '.join(ROTATIONS)}, got {mode!r}")
    if mode == "none":
        return None
    if mode == "so3":
        from eqvit.groups.so3 import random_rotations as haar

        return haar(n, generator=generator, dtype=torch.float64)
    angle = 2 * math.pi * torch.rand(n, generator=generator, dtype=torch.float64)
    c, s, zero, one = angle.cos(), angle.sin(), torch.zeros(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
    return torch.stack([c, -s, zero, s, c, zero, zero, zero, one], dim=-1).view(n, 3, 3)


class AtomCounts:
    """The distribution of atom counts of a split: ``probabilities [max + 1]`` (index = count)."""

    def __init__(self, counts: np.ndarray) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        if counts.size == 0 or (counts < 1).any():
            raise ValueError(
                f"expected positive atom counts, got {counts.size} counts with minimum {counts.min(initial=0)}"
            )
        histogram = np.bincount(counts)
        self.probabilities = histogram / histogram.sum()

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``[n]`` atom counts drawn from the distribution."""
        return rng.choice(len(self.probabilities), size=n, p=self.probabilities)


def _smiles_cache(split: QM9Dataset, cache_dir: Path) -> Path:
    key = hashlib.sha1(np.ascontiguousarray(split.ids).tobytes() + str(len(split.arrays)).encode()).hexdigest()[:12]
    return cache_dir / f"qm9-train-smiles-{key}-v2.txt"  # v2: with its checksum header


def training_smiles(split: QM9Dataset, cache_dir: Path) -> set[str]:
    """The canonical SMILES of the valid molecules of ``split`` (:func:`eqvit.chem.rdkit_mols.smiles_of`, the same
    bonds and canonicalisation as the generated molecules), computed once and cached as text in ``cache_dir``."""
    from eqvit.chem.rdkit_mols import require_gen, smiles_of

    require_gen("novelty against the training set")

    def build() -> set[str]:
        smiles = smiles_of([molecule(split, i) for i in range(len(split))])
        return {s for s in smiles if s is not None}

    return cached(_smiles_cache(split, Path(cache_dir)), _load_smiles, build, _save_smiles, "QM9 training SMILES")


_SMILES_HEADER = "# eqvit QM9 training SMILES, sha256 "


def _save_smiles(path: Path, smiles: set[str]) -> None:
    """One SMILES a line after a header with the SHA-256 of the lines (:func:`_load_smiles` checks it)."""
    body = "\n".join(sorted(smiles))
    text = f"{_SMILES_HEADER}{hashlib.sha256(body.encode()).hexdigest()}\n{body}"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _load_smiles(path: Path) -> set[str]:
    try:
        header, _, body = path.read_text(encoding="utf-8").partition("\n")
    except (OSError, UnicodeDecodeError) as err:
        raise CorruptCacheError(f"{type(err).__name__}: {err}") from None
    if not header.startswith(_SMILES_HEADER):
        raise CorruptCacheError("it has no checksum header")
    if hashlib.sha256(body.encode()).hexdigest() != header[len(_SMILES_HEADER) :]:
        raise CorruptCacheError("its lines do not match the checksum stored with them")
    return set(body.split())
