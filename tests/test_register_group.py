"""Users add groups by name: ``register_group`` then ``get_group``."""

from __future__ import annotations

import numpy as np
import pytest

from eqvit.groups import FiniteGroup, get_group, register_group
from eqvit.groups.base import close_under_multiplication


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
