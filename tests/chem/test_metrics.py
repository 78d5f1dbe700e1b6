"""Molecule metrics: EDM's bond table and stability (the dataset reproduces EDM's figures for QM9 itself),
RDKit validity, uniqueness and novelty, PoseBusters' checks, the files ``eqvit sample`` writes, and the
one-paragraph error when the ``gen`` extra is missing."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from eqvit.chem.bonds import DOUBLE, ELEMENTS, SINGLE, THRESHOLDS, TRIPLE, atom_stability, bond_orders, stability
from eqvit.chem.rdkit_mols import require_gen
from eqvit.utils import MissingExtraError

H, C, N, O, F = range(5)
HAS_GEN = all(importlib.util.find_spec(p) is not None for p in ("rdkit", "posebusters"))
gen = pytest.mark.skipif(not HAS_GEN, reason="needs the gen extra (rdkit, posebusters)")


def methane(ch: float = 1.09) -> tuple[np.ndarray, np.ndarray]:
    corners = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]) / np.sqrt(3)
    return np.vstack([[0, 0, 0], ch * corners]), np.array([C, H, H, H, H])


def ethylene(cc: float = 1.33) -> tuple[np.ndarray, np.ndarray]:
    """Planar H2C=CH2 with C-H 1.09 Å at 121.5 degrees from the C=C axis."""
    a = np.radians(121.5)
    h = 1.09 * np.array([np.cos(a), np.sin(a), 0.0])
    c1, c2 = np.array([-cc / 2, 0, 0]), np.array([cc / 2, 0, 0])
    flip = np.array([1, -1, 1])
    mirror = np.array([-1, 1, 1])
    pos = np.array([c1, c2, c1 + h, c1 + h * flip, c2 + h * mirror, c2 + h * mirror * flip])
    return pos, np.array([C, C, H, H, H, H])


def test_bond_tables_are_edms():
    assert SINGLE[("H", "C")] == 109 and SINGLE[("C", "C")] == 154 and SINGLE[("O", "F")] == 142
    assert DOUBLE[("C", "O")] == 120 and TRIPLE[("C", "N")] == 116 and ("H", "C") not in DOUBLE
    assert np.array_equal(THRESHOLDS, THRESHOLDS.transpose(0, 2, 1))  # symmetric in the pair
    # thresholds in Å: length + 10 / 5 / 3 pm
    assert THRESHOLDS[0, C, C] == pytest.approx(1.64) and THRESHOLDS[1, C, C] == pytest.approx(1.39)
    assert THRESHOLDS[2, C, N] == pytest.approx(1.19) and THRESHOLDS[1, H, C] == -np.inf


def test_bond_orders_of_methane_and_ethylene():
    pos, types = methane()
    orders = bond_orders(pos, types)
    assert orders[0].tolist() == [0, 1, 1, 1, 1] and orders[1:, 1:].sum() == 0
    assert atom_stability(pos, types).all()
    pos, types = ethylene()
    orders = bond_orders(pos, types)
    assert orders[0, 1] == 2 and atom_stability(pos, types).all()
    orders = bond_orders(*ethylene(cc=1.45))  # too long for a double bond: single, both carbons under-bonded
    assert orders[0, 1] == 1 and atom_stability(*ethylene(cc=1.45)).tolist() == [False, False, True, True, True, True]
    assert bond_orders(*ethylene(cc=1.15))[0, 1] == 3  # short enough for a triple bond


def test_stability_counts_atoms_and_molecules():
    stretched = methane()
    stretched[0][1] *= 1.6  # one hydrogen too far: it and the carbon are unstable
    result = stability([methane(), stretched])
    assert result["atom_stability"] == pytest.approx(8 / 10) and result["molecule_stability"] == 0.5


def test_bad_types_are_a_value_error():
    with pytest.raises(ValueError, match=r"indices into H, C, N, O, F"):
        bond_orders(np.zeros((2, 3)), np.array([0, 7]))
    with pytest.raises(ValueError, match=r"positions \[2, 3\] for 2 atoms"):
        bond_orders(np.zeros((3, 3)), np.array([0, 1]))


@pytest.mark.skipif(importlib.util.find_spec("qm9pack") is None, reason="needs the qm9 extra (qm9pack)")
def test_qm9_itself_reproduces_edms_dataset_row():
    """EDM reports 99.0% atom and 95.2% molecule stability for QM9 with hydrogens."""
    from eqvit.data.qm9 import qm9_splits
    from eqvit.data.qm9_generation import molecule

    train = qm9_splits()["train"]
    result = stability([molecule(train, i) for i in range(3000)])
    assert 0.985 < result["atom_stability"] < 0.997
    assert 0.93 < result["molecule_stability"] < 0.965


# ------------------------------------------------------------------------------------------------ RDKit


def _invalid() -> tuple[np.ndarray, np.ndarray]:
    """A carbon with five hydrogens at bonding distance: a valence RDKit refuses."""
    pos, types = methane()
    return np.vstack([pos, [[0.0, 0.0, -1.09]]]), np.append(types, H)


@gen
def test_validity_uniqueness_and_novelty():
    from eqvit.chem.metrics import molecule_metrics
    from eqvit.chem.rdkit_mols import smiles_of

    molecules = [methane(), methane(), ethylene(), _invalid()]
    assert smiles_of(molecules) == ["C", "C", "C=C", None]
    result = molecule_metrics(molecules, training_smiles={"C"}, posebusters=False)
    assert result["validity"] == 0.75 and result["uniqueness"] == pytest.approx(2 / 3)
    assert result["valid_and_unique"] == pytest.approx(0.5) and result["novelty"] == 0.5  # C=C is new
    assert result["atom_stability"] == pytest.approx(21 / 22)  # only _invalid's carbon (5 bonds) is unstable
    assert "pb_all" not in result


@gen
def test_largest_fragment_decides_validity():
    from eqvit.chem.rdkit_mols import smiles_of

    pos, types = ethylene()
    far = _invalid()[0] + 20.0  # a smaller, invalid fragment far away: the molecule stays valid
    assert smiles_of([(np.vstack([pos, far[:2]]), np.append(types, [C, H]))]) == ["C=C"]


@gen
def test_posebusters_rates_on_valid_molecules():
    from eqvit.chem.metrics import molecule_metrics

    result = molecule_metrics([methane(), ethylene(), _invalid()], posebusters=True, energy_limit=1)
    for check in ("sanitization", "all_atoms_connected", "bond_lengths", "bond_angles", "internal_steric_clash"):
        assert result[f"pb_{check}"] == 1.0, check
    assert result["pb_internal_energy_checked"] == 1 and 0.0 <= result["pb_internal_energy"] <= 1.0
    assert result["pb_all"] == 1.0 and "novelty" not in result


@gen
def test_files_written_for_the_samples(tmp_path):
    from rdkit import Chem

    from eqvit.chem.io import depict, write_sdf, write_xyz

    molecules = [methane(), ethylene(), _invalid()]
    write_xyz(molecules, tmp_path / "s.xyz")
    lines = (tmp_path / "s.xyz").read_text().splitlines()
    assert lines[0] == "5" and lines[2].startswith("C ") and len(lines) == 3 * 2 + 5 + 6 + 6
    smiles = write_sdf(molecules, tmp_path / "s.sdf")
    assert smiles == ["C", "C=C", None]
    read = list(Chem.SDMolSupplier(str(tmp_path / "s.sdf"), sanitize=False, removeHs=False))
    assert [m.GetNumAtoms() for m in read] == [5, 6, 6]
    assert [m.GetProp("valid") for m in read] == ["1", "1", "0"]
    np.testing.assert_allclose(read[1].GetConformer().GetPositions(), molecules[1][0], atol=1e-4)
    depict(["C", "C=C"], tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no valid molecule"):
        depict(["not a smiles"], tmp_path / "n.png")


# ------------------------------------------------------------------------------------------------ the extra


def test_missing_gen_extra_is_one_paragraph(monkeypatch, capsys):
    """With RDKit's import made to fail, ``eqvit sample`` exits 2 with one paragraph naming the extra."""
    from eqvit.cli import main

    monkeypatch.setitem(sys.modules, "rdkit", None)  # `import rdkit` now raises ImportError
    with pytest.raises(MissingExtraError, match=r"eqvit\[gen\]"):
        require_gen()
    code = main(["sample", "configs/dip_qm9.yaml", "--checkpoint", "missing.safetensors", "--out", "x"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("eqvit: error: eqvit sample need") and 'pip install "eqvit[gen]"' in err and "rdkit" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert ELEMENTS == ("H", "C", "N", "O", "F")
