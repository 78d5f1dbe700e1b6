"""RDKit molecules from atoms and positions, and the checks that need RDKit (the ``gen`` extra).

A generated molecule ``(positions [n, 3] Å, types [n])`` becomes an RDKit molecule with the bonds of EDM's distance
table (:func:`eqvit.chem.bonds.bond_orders`: single, double, triple) and its coordinates as a conformer. It is
*valid* when its largest connected fragment passes RDKit's sanitisation; its SMILES is the canonical SMILES of
that fragment with the hydrogens made implicit, which uniqueness and novelty compare.

RDKit and PoseBusters are imported on first use: :func:`require_gen` turns their absence into a
:class:`~eqvit.utils.MissingExtraError` (a ValueError, reported by the CLI in one paragraph with exit code 2).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eqvit.chem.bonds import ELEMENTS, bond_orders
from eqvit.utils import require_extra

GEN_PACKAGES = ("rdkit", "posebusters")


def require_gen(what: str = "molecule metrics") -> None:
    """:class:`~eqvit.utils.MissingExtraError` naming the ``gen`` extra unless RDKit and PoseBusters import."""
    require_extra("gen", GEN_PACKAGES, what)


def _chem():
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")  # sanitisation failures of generated molecules are expected, not news
    return Chem


def _quiet():
    """A context in which RDKit logs nothing (a generated molecule's failures are expected, not news)."""
    from rdkit import rdBase

    return rdBase.BlockLogs()


def build_molecule(positions: np.ndarray, types: np.ndarray) -> Any:
    """An RDKit ``Mol`` (not sanitised) with the table's bonds and ``positions`` as its conformer."""
    from rdkit.Geometry import Point3D

    Chem = _chem()
    kinds = {1: Chem.BondType.SINGLE, 2: Chem.BondType.DOUBLE, 3: Chem.BondType.TRIPLE}
    orders = bond_orders(positions, types)
    mol = Chem.RWMol()
    for k in np.asarray(types):
        mol.AddAtom(Chem.Atom(ELEMENTS[int(k)]))
    for i, j in zip(*np.nonzero(np.triu(orders))):
        mol.AddBond(int(i), int(j), kinds[int(orders[i, j])])
    conformer = Chem.Conformer(len(types))
    for i, p in enumerate(np.asarray(positions, dtype=np.float64)):
        conformer.SetAtomPosition(i, Point3D(*(float(v) for v in p)))
    mol.AddConformer(conformer, assignId=True)
    return mol.GetMol()


def sanitized(mol: Any) -> Any | None:
    """A sanitised copy of ``mol``, or None when RDKit's sanitisation fails."""
    Chem = _chem()
    copy = Chem.Mol(mol)
    with _quiet():
        try:
            Chem.SanitizeMol(copy)
        except Exception:  # RDKit raises several types (valence, kekulisation, ...): all mean invalid
            return None
    return copy


def largest_fragment_smiles(mol: Any) -> str | None:
    """The canonical SMILES (hydrogens implicit) of ``mol``'s largest fragment if it sanitises, else None."""
    Chem = _chem()
    fragments = Chem.GetMolFrags(mol, asMols=True, sanitizeFrags=False)
    largest = sanitized(max(fragments, key=lambda m: m.GetNumAtoms()))
    if largest is None:
        return None
    with _quiet():
        try:
            return Chem.MolToSmiles(Chem.RemoveHs(largest))
        except Exception:
            return None


def smiles_of(molecules: list[tuple[np.ndarray, np.ndarray]]) -> list[str | None]:
    """:func:`largest_fragment_smiles` of each ``(positions, types)`` pair (None: invalid)."""
    return [largest_fragment_smiles(build_molecule(p, t)) for p, t in molecules]
