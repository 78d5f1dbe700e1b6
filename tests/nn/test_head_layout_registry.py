"""A new attention head layout is one registration: registered here, inside the test (no file of the package
edited), it builds into an O(2) model and into Platonic image and point models, each exactly equivariant in
float64; a layout whose heads are not G-stable is refused when the model is built."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import randomise_

import eqvit
from eqvit.nn.irrep_attention import list_head_layouts, register_head_layout, unregister_head_layout
from eqvit.nn.irrep_features import FeatureType
from eqvit.testing import assert_equivariant


def heads_by_irrep_dimension(ftype: FeatureType, num_heads: int) -> list[np.ndarray]:
    """One head for the coordinates of the 1-d irreps, one for the 2-d ones, ... (``num_heads`` ignored):
    unions of whole irrep copies, so each head is G-stable."""
    by_dim: dict[int, list[np.ndarray]] = {}
    for i, rho, _, _ in ftype.blocks():
        by_dim.setdefault(rho.dim, []).append(ftype.block_coords(i).reshape(-1))
    return [np.sort(np.concatenate(parts)) for _, parts in sorted(by_dim.items())]


def first_coordinate_alone(ftype: FeatureType, num_heads: int) -> list[np.ndarray]:
    """Coordinate 0 in a head of its own: it splits a 2-d irrep copy whenever one comes first, not G-stable."""
    order = np.concatenate([ftype.block_coords(i).reshape(-1) for i, *_ in reversed(ftype.blocks())])
    return [order[:1], np.sort(order[1:])]


@pytest.fixture
def by_dimension():
    register_head_layout("by_irrep_dimension", heads_by_irrep_dimension)
    register_head_layout("first_alone", first_coordinate_alone)
    yield "by_irrep_dimension"
    unregister_head_layout("by_irrep_dimension")
    unregister_head_layout("first_alone")


MODELS = [("o2vit_square_tiny", {}), ("platonic_image_tiny", {"stream": "frames"}), ("platonic_points_tiny", {})]


@pytest.mark.parametrize(("name", "kwargs"), MODELS, ids=[m for m, _ in MODELS])
def test_a_layout_registered_in_a_test_builds_into_every_family(by_dimension, name, kwargs):
    model = randomise_(eqvit.create_model(name, attention=by_dimension, **kwargs))
    attn = model.blocks[0].attn
    heads = attn.head_dims if hasattr(attn, "head_dims") else attn.inner.head_dims
    assert len(heads) == len({rho.dim for rho in model.token_type.group.irreps})  # one head per irrep dimension
    report = assert_equivariant(model, batch_size=1)  # float64, every element of the model's group
    assert report.passed and len(report.rows) == model.group.order


def test_registered_layouts_are_listed_and_names_are_unique(by_dimension):
    assert {"coupled", "irrepwise", "frames", by_dimension} <= set(list_head_layouts())
    with pytest.raises(ValueError, match="registered already"):
        register_head_layout("coupled", heads_by_irrep_dimension)


def test_a_layout_that_splits_an_irrep_copy_is_refused(by_dimension):
    with pytest.raises(ValueError, match="whole irrep copies"):
        eqvit.create_model("o2vit_square_tiny", attention="first_alone")


def test_an_unknown_layout_names_the_registered_ones():
    for name in ("o2vit_square_tiny", "platonic_image_tiny"):
        with pytest.raises(ValueError, match="irrepwise"):
            eqvit.create_model(name, attention="no_such_layout")
