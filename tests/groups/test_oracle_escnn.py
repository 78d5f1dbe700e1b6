"""Characters agree with escnn's (the `oracle` extra; skipped without escnn).

Planar groups are matched element by element through escnn's 2-D irrep of frequency 1 (the
natural action on the plane). escnn's O and I sit in other orientations than ours, so elements
are matched by a class signature computed inside each group: (trace of the rotation matrix,
number of square roots of the element), which separates all conjugacy classes of O and I.
"""

from collections import Counter

import numpy as np
import pytest

from eqvit.groups import get_group

escnn_group = pytest.importorskip("escnn.group")

pytestmark = pytest.mark.oracle


def _character_rows(chars):
    """Irrep characters as a sorted list of rounded tuples, for order-free comparison."""
    return sorted(tuple(np.round(c, 6)) for c in chars)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 8])
@pytest.mark.parametrize("kind", ["C", "D"])
def test_planar_characters_match_escnn(kind, n):
    ours = get_group(f"{kind}{n}")
    theirs = escnn_group.cyclic_group(n) if kind == "C" else escnn_group.dihedral_group(n)
    natural = theirs.irrep(1) if kind == "C" else theirs.irrep(1, 1)
    elements = list(theirs.elements)
    order = [ours.index_of(natural(e)) for e in elements]
    assert sorted(order) == list(range(ours.order))
    their_chars = [[np.trace(psi(e)) for e in elements] for psi in theirs.irreps()]
    our_chars = [rho.character[order] for rho in ours.irreps]
    assert _character_rows(our_chars) == _character_rows(their_chars)


def _signatures(matrices):
    """Per element: (trace, number of square roots) — a class function separating O's and I's classes."""
    n = len(matrices)
    flat = matrices.reshape(n, -1)
    squares = np.einsum("iab,ibc->iac", matrices, matrices).reshape(n, -1)
    roots = [(np.abs(squares - flat[g]).max(-1) < 1e-6).sum() for g in range(n)]
    return [(round(float(np.trace(m)), 6), int(r)) for m, r in zip(matrices, roots)]


def _class_table(signatures, chars):
    table = {}
    for sig, *values in zip(signatures, *chars):
        table.setdefault(sig, tuple(np.round(values, 6)))
    return table


@pytest.mark.parametrize("name, build", [("O", "octa_group"), ("I", "ico_group")])
def test_platonic_characters_match_escnn(name, build):
    ours = get_group(name)
    theirs = getattr(escnn_group, build)()
    elements = list(theirs.elements)
    their_mats = np.stack([np.asarray(e.to("MAT"), dtype=np.float64) for e in elements])
    their_sig, our_sig = _signatures(their_mats), _signatures(ours.elements)
    assert Counter(their_sig) == Counter(our_sig)
    assert len(set(our_sig)) == len(ours.conjugacy_classes)
    their_chars = np.array([[np.trace(psi(e)) for e in elements] for psi in theirs.irreps()])
    our_chars = ours.character_table
    # Compare the character table class by class: each irrep's values on the classes.
    t_table = _class_table(their_sig, their_chars)
    o_table = _class_table(our_sig, our_chars)
    keys = sorted(o_table)
    t_rows = sorted(zip(*[t_table[k] for k in keys]))
    o_rows = sorted(zip(*[o_table[k] for k in keys]))
    assert t_rows == o_rows
    assert sorted(psi.size for psi in theirs.irreps()) == sorted(rho.dim for rho in ours.irreps)
