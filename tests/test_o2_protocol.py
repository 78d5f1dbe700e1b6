"""The O(2) seed's protocol: its head layouts (Table 1), MLP G-sets by subgroup name (Sec. 5.3), and the
folder-driven experiments (Sec. 5.1 / 5.2 / 5.3 drivers) on a small generated image folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import eqvit
from eqvit.groups import get_group
from eqvit.models.o2vit import default_mlp_spaces, trivial_fraction
from eqvit.nn.irrep_attention import IrrepAttention, irrepwise_heads
from eqvit.nn.irrep_features import FeatureType
from eqvit.testing import EquivarianceError, assert_equivariant

TABLE1 = {"A": 1, "B": 1, "E1": 2}


def c4_model(q: int = 1, **kwargs):
    args = dict(group="C4", img_size=8, patch_size=4, depth=2, regular_copies=4 * q, num_classes=3)
    return eqvit.create_model("o2vit_square_s", **dict(args, **kwargs))


@pytest.mark.parametrize("q", [1, 2])
def test_table1_layouts_give_four_heads_of_4q_features(q):
    irrepwise = c4_model(q, attention="irrepwise", irrep_heads=TABLE1)
    coupled = c4_model(q, attention="coupled", num_heads=4)
    assert irrepwise.head_dims == coupled.head_dims == [4 * q] * 4
    heads = irrepwise.blocks[0].attn.heads
    ftype = irrepwise.feature_type
    irrep_of = np.array([ftype.copies[c][0] for c in ftype.copy_index])
    # one head of A, one of B, two of E1 (Table 1), each holding copies of one irrep only
    assert [sorted({ftype.irreps[i].name for i in irrep_of[h]}) for h in heads] == [["A"], ["B"], ["E1"], ["E1"]]
    # the seed's "E" names the 2-d irrep E1 of C4
    assert c4_model(q, attention="irrepwise", irrep_heads={"A": 1, "B": 1, "E": 2}).head_dims == [4 * q] * 4


def test_default_irrepwise_and_coupled_head_dims():
    assert c4_model(attention="irrepwise", num_heads=2).head_dims == [2, 2, 2, 2, 4, 4]  # 2 per irrep
    m = eqvit.create_model("o2vit_square_tiny")  # D4, 3 coupled heads, 3 regular copies
    assert m.head_dims == [8, 8, 8]


@pytest.mark.parametrize(
    ("irrep_heads", "message"),
    [
        ({"A": 1, "B": 1, "E1": 3}, r"E1: multiplicity 4, 3 heads"),
        ({"A": 1, "B": 1}, r"no head count for the irreps \['E1'\]"),
        ({"A": 1, "B": 1, "E1": 2, "A1": 1}, r"unknown irrep of C4 \(irrep_heads\) 'A1'.*Valid: A, B, E1"),
        ({"A": 0, "B": 1, "E1": 2}, r"irrep_heads\['A'\]: expected a number of heads >= 1"),
    ],
)
def test_irrep_heads_errors(irrep_heads, message):
    with pytest.raises(ValueError, match=message):
        c4_model(attention="irrepwise", irrep_heads=irrep_heads)


def test_irrep_heads_need_irrepwise_attention():
    with pytest.raises(ValueError, match="irrep_heads needs attention='irrepwise'"):
        c4_model(attention="coupled", irrep_heads=TABLE1)


def test_d6_irrep_heads_by_irrep():
    ftype = FeatureType.regular(get_group("D6"), 2)  # A1 A2 B1 B2 x2, E1 E2 x4
    heads = irrepwise_heads(ftype, {"A1": 1, "A2": 2, "B1": 1, "B2": 1, "E1": 4, "E2": 2})
    assert [len(h) for h in heads] == [2, 1, 1, 2, 2, 2, 2, 2, 2, 4, 4]


def test_mlp_spaces_by_subgroup_name():
    G = get_group("D4")
    spaces = default_mlp_spaces(G, [("C2", 2), ("D1", 1), ("regular", 1), ("D2[45deg]", 1)], 1)
    assert [(list(s) if not isinstance(s, str) else s, n) for s, n in spaces] == [
        ([0, 2], 2),
        ([0, 4], 1),
        ("regular", 1),
        ([0, 2, 5, 7], 1),
    ]
    # the seed's Sec. 5.3 G-sets: A1 fractions 1/8, 9/16, 3/8
    assert trivial_fraction(G, [("regular", 3)]) == 1 / 8
    assert trivial_fraction(G, [("regular", 3), ("trivial", 24)]) == 9 / 16
    assert trivial_fraction(G, [("C4", 2), ("D1", 2), ("D2[45deg]", 2)]) == 3 / 8
    model = eqvit.create_model(
        "o2vit_square_tiny", mlp_spaces=[("C4", 1), ("D1", 1), ("D2[45deg]", 1)], num_classes=3
    )
    act = model.blocks[0].mlp.act
    assert act.ftype.multiplicities[0] == 3  # one A1 per orbit
    assert act.basis.shape[0] == 2 + 4 + 2  # |D4/C4| + |D4/D1| + |D4/D2'|


def test_mlp_spaces_unknown_name_lists_the_subgroups():
    with pytest.raises(ValueError, match=r"unknown subgroup of D4 \(mlp_spaces\) 'D3'.*Valid: regular, trivial, C1"):
        eqvit.create_model("o2vit_square_tiny", mlp_spaces=[("D3", 1)])
    with pytest.raises(ValueError, match="expected a count >= 0"):
        eqvit.create_model("o2vit_square_tiny", mlp_spaces=[("C2", -1)])


@pytest.mark.parametrize(
    "make",
    [
        lambda: c4_model(attention="irrepwise", irrep_heads=TABLE1),
        lambda: c4_model(attention="coupled", num_heads=4),
        lambda: eqvit.create_model(
            "o2vit_square_tiny", mlp_spaces=[("C2", 2), ("D1", 1), ("regular", 1)], num_classes=3
        ),
        lambda: eqvit.create_model(
            "o2vit_square_tiny", mlp_spaces=[("C4", 1), ("D1", 1), ("D2[45deg]", 1)], num_classes=3
        ),
        lambda: eqvit.create_model(
            "o2vit_hex_tiny",
            attention="irrepwise",
            regular_copies=2,
            irrep_heads={"A1": 1, "A2": 1, "B1": 2, "B2": 1, "E1": 2, "E2": 4},
            mlp_spaces=[("D3", 1), ("C2", 1), ("D1[30deg]", 1)],
        ),
    ],
    ids=["c4-irrepwise-table1", "c4-coupled-4heads", "d4-gset-C2-D1-regular", "d4-gset-sec5.3", "d6-irrep-heads"],
)
def test_new_layouts_are_invariant_in_float64(make):
    torch.manual_seed(0)
    report = assert_equivariant(make().eval(), dtype=torch.float64)
    assert report.max_relative_error < 1e-10


def test_a_head_that_splits_an_irrep_copy_is_refused_and_would_break_equivariance():
    ftype = FeatureType.regular(get_group("C4"), 1)  # A, B, E1 (coordinates 2, 3)
    with pytest.raises(ValueError, match="whole irrep copies"):
        IrrepAttention(ftype, [np.array([0, 1, 2]), np.array([3])])
    # bypass the check: the split E1 copy makes the layer non-equivariant, and the checker sees it
    attn = IrrepAttention(ftype, [np.array([0, 1, 2, 3])], attn_drop=0.0)
    attn.heads = [np.array([0, 1, 2]), np.array([3])]
    attn._groups = [(0, 1, 3), (3, 1, 1)]
    with pytest.raises(EquivarianceError):
        assert_equivariant(attn.eval(), dtype=torch.float64)
