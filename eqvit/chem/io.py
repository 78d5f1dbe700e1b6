"""Generated molecules to files: ``.xyz`` (numpy only), ``.sdf`` and a PNG grid of 2-D depictions (RDKit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eqvit.chem.bonds import ELEMENTS
from eqvit.chem.rdkit_mols import build_molecule, largest_fragment_smiles


def write_xyz(molecules: list[tuple[np.ndarray, np.ndarray]], path: str | Path) -> None:
    """All molecules in one multi-frame ``.xyz`` file (atom count, a comment line, ``element x y z`` in Å)."""
    lines = []
    for k, (positions, types) in enumerate(molecules):
        lines += [str(len(types)), f"sample {k}"]
        lines += [f"{ELEMENTS[int(t)]} {x:.6f} {y:.6f} {z:.6f}" for t, (x, y, z) in zip(types, positions)]
    Path(path).write_text("\n".join(lines) + "\n")


def write_sdf(molecules: list[tuple[np.ndarray, np.ndarray]], path: str | Path) -> list[str | None]:
    """All molecules in one ``.sdf`` with the bonds of EDM's table, each with the properties ``sample``, ``valid``
    and ``smiles`` (of its largest fragment, empty when invalid); returns the SMILES (None: invalid)."""
    from rdkit import Chem

    out = []
    writer = Chem.SDWriter(str(path))
    try:
        for k, (positions, types) in enumerate(molecules):
            mol = build_molecule(positions, types)
            smiles = largest_fragment_smiles(mol)
            mol.UpdatePropertyCache(strict=False)  # an invalid molecule is written as built
            mol.SetProp("_Name", f"sample {k}")
            mol.SetProp("sample", str(k))
            mol.SetProp("valid", str(int(smiles is not None)))
            mol.SetProp("smiles", smiles or "")
            writer.write(mol)
            out.append(smiles)
    finally:
        writer.close()
    return out


def depict(smiles: list[str], path: str | Path, per_row: int = 6, size: int = 220) -> None:
    """A PNG grid of RDKit's 2-D depictions of ``smiles`` (hydrogens implicit), each labelled with its SMILES."""
    from rdkit import Chem
    from rdkit.Chem import Draw

    mols = [Chem.MolFromSmiles(s) for s in smiles]
    keep = [(m, s) for m, s in zip(mols, smiles) if m is not None]
    if not keep:
        raise ValueError("no valid molecule to depict")
    image = Draw.MolsToGridImage(
        [m for m, _ in keep], molsPerRow=per_row, subImgSize=(size, size), legends=[s for _, s in keep]
    )
    image.save(str(path))
