"""EDM's stability check (Hoogeboom et al. 2022): bonds from interatomic distances, valencies per element.

Bond lengths (pm) are the typical lengths EDM's appendix tabulates for H, C, N, O, F (single, double, triple);
a pair is bonded with order k when its distance is below the order-k length plus a margin (10, 5 and 3 pm for
single, double and triple), taking the highest order that applies and that the tables list for the pair. An
atom is stable when the orders of its bonds sum to its valency (H 1, C 4, N 3, O 2, F 1); a molecule is stable
when all its atoms are. numpy only: no RDKit needed.
"""

from __future__ import annotations

import numpy as np

ELEMENTS = ("H", "C", "N", "O", "F")
VALENCY = {"H": 1, "C": 4, "N": 3, "O": 2, "F": 1}
# Typical bond lengths in pm (unordered pairs).
SINGLE = {
    ("H", "H"): 74, ("H", "C"): 109, ("H", "N"): 101, ("H", "O"): 96, ("H", "F"): 92,
    ("C", "C"): 154, ("C", "N"): 147, ("C", "O"): 143, ("C", "F"): 135,
    ("N", "N"): 145, ("N", "O"): 140, ("N", "F"): 136,
    ("O", "O"): 148, ("O", "F"): 142,
    ("F", "F"): 142,
}  # fmt: skip
DOUBLE = {("C", "C"): 134, ("C", "N"): 129, ("C", "O"): 120, ("N", "N"): 125, ("N", "O"): 121, ("O", "O"): 121}
TRIPLE = {("C", "C"): 120, ("C", "N"): 116, ("C", "O"): 113, ("N", "N"): 110}
MARGINS_PM = (10.0, 5.0, 3.0)  # single, double, triple


def _table(lengths: dict[tuple[str, str], float]) -> np.ndarray:
    """``[5, 5]`` symmetric table over :data:`ELEMENTS` in Å; a pair the table lacks is ``-inf`` (never bonded)."""
    out = np.full((len(ELEMENTS), len(ELEMENTS)), -np.inf)
    for (a, b), pm in lengths.items():
        i, j = ELEMENTS.index(a), ELEMENTS.index(b)
        out[i, j] = out[j, i] = pm / 100.0
    return out


# Bond-order thresholds in Å: length + margin per order, [3, 5, 5].
THRESHOLDS = np.stack([_table(t) + m / 100.0 for t, m in zip((SINGLE, DOUBLE, TRIPLE), MARGINS_PM)])
VALENCIES = np.array([VALENCY[e] for e in ELEMENTS])


def check_types(types: np.ndarray) -> np.ndarray:
    types = np.asarray(types, dtype=np.int64)
    if types.ndim != 1 or (types < 0).any() or (types >= len(ELEMENTS)).any():
        raise ValueError(
            f"expected atom types [n] as indices into {', '.join(ELEMENTS)} (0..{len(ELEMENTS) - 1}), got "
            f"{types.tolist() if types.size < 40 else types.shape}"
        )
    return types


def bond_orders(positions: np.ndarray, types: np.ndarray) -> np.ndarray:
    """``positions [n, 3]`` (Å), ``types [n]`` (indices into :data:`ELEMENTS`) -> bond orders ``[n, n]`` (0..3)."""
    positions = np.asarray(positions, dtype=np.float64)
    types = check_types(types)
    if positions.shape != (len(types), 3):
        raise ValueError(f"expected positions [{len(types)}, 3] for {len(types)} atoms, got {list(positions.shape)}")
    dist = np.linalg.norm(positions[:, None] - positions[None], axis=-1)
    below = dist[None] < THRESHOLDS[:, types[:, None], types[None]]  # [3, n, n]: within each order's threshold
    # the highest order k whose threshold holds along with all lower ones (a triple bond is also a double one)
    orders = np.cumprod(below, axis=0).sum(0)
    np.fill_diagonal(orders, 0)
    return orders


def atom_stability(positions: np.ndarray, types: np.ndarray) -> np.ndarray:
    """``[n]`` bool: the bond orders of each atom sum to its element's valency."""
    types = check_types(types)
    return bond_orders(positions, types).sum(1) == VALENCIES[types]


def stability(molecules: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """``atom_stability`` (fraction of all atoms) and ``molecule_stability`` (fraction of molecules whose atoms are
    all stable) of ``(positions [n, 3], types [n])`` pairs."""
    stable_atoms = total_atoms = stable_molecules = 0
    for positions, types in molecules:
        ok = atom_stability(positions, types)
        stable_atoms += int(ok.sum())
        total_atoms += len(ok)
        stable_molecules += bool(ok.all())
    return {
        "atom_stability": stable_atoms / max(total_atoms, 1),
        "molecule_stability": stable_molecules / max(len(molecules), 1),
    }
