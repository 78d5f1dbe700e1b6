"""Every score of a set of generated molecules ``(positions [n, 3] Å, types [n])``, as one flat dict.

- ``atom_stability``, ``molecule_stability``: EDM's check (:mod:`eqvit.chem.bonds`);
- ``validity``: the fraction whose largest fragment sanitises in RDKit (:mod:`eqvit.chem.rdkit_mols`);
- ``uniqueness``: distinct canonical SMILES among the valid ones / valid ones;
  ``valid_and_unique`` = ``validity * uniqueness`` (EDM's "valid and unique");
- ``novelty``: distinct valid SMILES absent from the training set / distinct valid SMILES;
- ``pb_<check>``: PoseBusters' molecule checks (its ``"mol"`` configuration) on the valid molecules, each a pass
  rate; ``pb_all`` passes every check run on all of them. The internal-energy check (50 conformers and a
  force field per molecule, about a second each) runs on the first ``energy_limit`` valid molecules, and
  ``pb_internal_energy_checked`` says how many.

Stability needs numpy only; the rest needs the ``gen`` extra (RDKit, PoseBusters).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

from eqvit.chem.bonds import stability
from eqvit.chem.rdkit_mols import build_molecule, largest_fragment_smiles, require_gen, sanitized

ENERGY_FUNCTION = "energy_ratio"
METRIC_NAMES = ("atom_stability", "molecule_stability", "validity", "uniqueness", "valid_and_unique", "novelty")


def _busters(energy: bool) -> Any:
    """PoseBusters on its ``"mol"`` checks: without (``energy=False``) or with only the internal-energy check."""
    from posebusters import PoseBusters

    logging.getLogger("posebusters").setLevel(logging.CRITICAL)
    config = dict(PoseBusters(config="mol").config)
    modules = [m for m in config["modules"] if (m["function"] == ENERGY_FUNCTION) == energy]
    # "mol" lists the energy module twice (once without a reported output): run it once, the reported one
    config["modules"] = [m for m in modules if not energy or m.get("chosen_binary_test_output")]
    return PoseBusters(config=config)


def _sanitized_or_built(mol: Any) -> Any:
    clean = sanitized(mol)
    return mol if clean is None else clean


def posebusters_rates(mols: list[Any], energy_limit: int = 100) -> dict[str, float]:
    """``pb_<check>`` pass rates of PoseBusters' molecule checks on ``mols`` (sanitised RDKit molecules with a
    conformer); the internal energy on the first ``energy_limit`` of them (0: not run)."""
    if not mols:
        return {}
    table = _busters(energy=False).bust(mols, None, None).astype(bool)
    out = {f"pb_{name}": float(table[name].mean()) for name in table.columns}
    out["pb_all"] = float(table.all(axis=1).mean())
    if energy_limit > 0:
        energy = _busters(energy=True).bust(mols[:energy_limit], None, None).astype(bool)
        for name in energy.columns:
            out[f"pb_{name}"] = float(energy[name].mean())
        out["pb_internal_energy_checked"] = len(energy)
    return out


def molecule_metrics(
    molecules: list[tuple[np.ndarray, np.ndarray]],
    training_smiles: Iterable[str] | None = None,
    posebusters: bool = True,
    energy_limit: int = 100,
) -> dict[str, float]:
    """The scores of the module docstring; ``training_smiles`` None leaves novelty out, ``posebusters=False``
    the PoseBusters rates."""
    require_gen()
    out: dict[str, float] = dict(stability(molecules))
    built = [build_molecule(p, t) for p, t in molecules]
    smiles = [largest_fragment_smiles(m) for m in built]
    valid = [s for s in smiles if s is not None]
    unique = set(valid)
    out["validity"] = len(valid) / max(len(molecules), 1)
    out["uniqueness"] = len(unique) / len(valid) if valid else 0.0
    out["valid_and_unique"] = out["validity"] * out["uniqueness"]
    if training_smiles is not None:
        known = set(training_smiles)
        out["novelty"] = len(unique - known) / len(unique) if unique else 0.0
    out["num_molecules"] = len(molecules)
    out["num_valid"] = len(valid)
    if posebusters:
        # a valid molecule whose smaller fragments do not sanitise is checked as built: PoseBusters fails it
        checked = [_sanitized_or_built(m) for m, s in zip(built, smiles) if s is not None]
        out.update(posebusters_rates(checked, energy_limit))
    return out
