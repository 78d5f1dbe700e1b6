"""Users add groups by name: ``register_group`` then ``get_group``."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import randomise_

import eqvit
from eqvit.groups import FiniteGroup, get_group, register_group
from eqvit.groups.base import close_under_multiplication
from eqvit.models.o2vit import subgroup_names
from eqvit.testing import assert_equivariant


def full_octahedral() -> FiniteGroup:
    """O_h: the cube's 48 symmetries, the rotations of O together with the inversion -I."""
    quarter_turn_z = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    three_fold = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    return FiniteGroup("Oh", close_under_multiplication([quarter_turn_z, three_fold, -np.eye(3)]))


def test_registered_group_is_built_with_its_irreps():
    register_group("Oh", full_octahedral)
    G = get_group("Oh")
    assert G.order == 48 and get_group("Oh") is G  # cached
    dims = sorted(rho.dim for rho in G.irreps)
    assert dims == [1, 1, 1, 1, 2, 2, 3, 3, 3, 3]  # O's irreps, each in an even and an odd version
    assert sum(d * d for d in dims) == 48


def test_register_group_refuses_builtin_and_duplicate_names():
    with pytest.raises(ValueError, match="built-in"):
        register_group("D4", full_octahedral)
    register_group("Oh", full_octahedral)  # the same factory again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_group("Oh", lambda: full_octahedral())


def test_unknown_name_lists_registered_groups():
    register_group("Oh", full_octahedral)
    with pytest.raises(ValueError, match="registered group: Oh"):
        get_group("Ohh")


# ------------------------------------------------------------------------------------------------
# every builder takes any group its geometry admits (a name, registered or built-in, or a FiniteGroup)


def test_a_registered_group_builds_platonic_point_models():
    """Oh (48 elements, reflections included) from register_group, by name and as an object."""
    register_group("Oh", full_octahedral)
    for group in ("Oh", get_group("Oh")):
        model = randomise_(eqvit.create_model("platonic_points_tiny", group=group, embed_dim=96))
        assert model.group.name == "Oh" and model.config["group"] == "Oh"
        report = assert_equivariant(model, batch_size=1)
        assert report.passed and len(report.rows) == 48


@pytest.mark.parametrize("name", ["o2vit_square_tiny", "platonic_image_tiny"])
def test_image_models_take_any_subgroup_of_the_lattice(name):
    """D2 with the diagonal mirrors, a subgroup of D4 that has no built-in name."""
    D4 = get_group("D4")
    diagonal = D4.subgroup(subgroup_names(D4)["D2[45deg]"])
    model = randomise_(eqvit.create_model(name, group=diagonal))
    assert model.group is diagonal
    report = assert_equivariant(model, batch_size=1)
    assert report.passed and len(report.rows) == 4


@pytest.mark.parametrize(
    ("name", "group", "message"),
    [
        ("o2vit_square_tiny", "C8", r"C8 does not map the pixels of a square patch onto itself: element 1, rot 45"),
        ("o2vit_hex_tiny", "D4", r"D4 does not map the pixels of a hex patch onto itself: element 1, rot 90"),
        ("platonic_image_tiny", "C3", r"C3 does not map the pixels of a square patch onto itself: element 1, rot 120"),
        ("platonic_image_tiny", "T", r"T acts in 3-D; the pixels of a square patch: 2-D points"),
        ("platonic_points_tiny", "D3", r"frames for 3-D positions must be 3x3 matrices; D3 acts in 2-D"),
    ],
)
def test_groups_the_geometry_does_not_admit_are_refused_saying_why(name, group, message):
    with pytest.raises(ValueError, match=message):
        eqvit.create_model(name, group=group)
