"""assert_equivariant's own argument checks: a group that does not act on the
model's domain (wrong dimension, or not closed on its points) and a bad tolerance are ValueErrors saying
what does not fit; the check still fails on a model that is not equivariant."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import eqvit
from eqvit.geometry.icosphere import icosphere
from eqvit.groups import get_group
from eqvit.models.so3vit import icosphere_domain
from eqvit.testing import EquivarianceError, assert_equivariant


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return eqvit.create_model(name)


@pytest.mark.parametrize(
    ("name", "group", "message"),
    [
        (
            "so3vit_tiny",
            "D4",
            r"group D4 acts in 2-D \(2x2 matrices\), but the model's domain \(icosphere level 3\) is 3-D",
        ),
        ("platonic_sphere_tiny", "C4", "group C4 acts in 2-D .* is 3-D"),
        ("platonic_points_tiny", "D6", r"group D6 acts in 2-D .*domain \(3-D point clouds\) is 3-D"),
        ("o2vit_square_tiny", "SO3", r"group SO3 acts in 3-D \(3x3 matrices\), but .*8x8 square grid\) is 2-D"),
        ("platonic_image_tiny", "I", "group I acts in 3-D .* is 2-D"),
        ("o2vit_hex_tiny", "O", "group O acts in 3-D .* is 2-D"),
    ],
)
def test_group_of_the_wrong_dimension(name, group, message):
    with pytest.raises(ValueError, match=message) as info:
        assert_equivariant(_model(name), group)
    assert "pass a" in str(info.value) and "reshape" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "group", "message"),
    [
        ("o2vit_square_tiny", "C8", r"group C8 does not act on the model's domain \(the 8x8 square grid\): element 1"),
        # a hexagonal model on square images: D6 rotates the image off its pixel grid
        ("o2vit_hex_tiny", "D6", r"group D6 does not act on the model's domain \(the 16x16 square grid\)"),
        ("so3vit_tiny", "O", r"group O does not act on the model's domain \(icosphere level 3\)"),
        ("so3vit_tiny", "SO3", r"SO\(3\) .* does not act on the model's domain \(icosphere level 3\)"),
    ],
)
def test_group_that_does_not_map_the_points_onto_themselves(name, group, message):
    with pytest.raises(ValueError, match=message):
        assert_equivariant(_model(name), group)


@pytest.mark.parametrize("tolerance", [-1, -1e-12, math.nan, -math.inf, "1e-5", True, [1e-5]])
def test_bad_tolerance(tolerance):
    with pytest.raises(ValueError, match="expected tolerance to be a number >= 0"):
        assert_equivariant(_model("o2vit_square_tiny"), tolerance=tolerance)


def test_infinite_tolerance_only_reports():
    report = assert_equivariant(_model("o2vit_square_tiny"), tolerance=math.inf)
    assert report.passed and report.max_relative_error < 1e-9


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(dtype=torch.int64), "expected dtype to be a floating-point torch dtype"),
        (dict(dtype="float64"), "expected dtype to be a floating-point torch dtype"),
        (dict(batch_size=0), "expected batch_size to be a positive integer, got 0"),
        (dict(num_rotations=-3), "expected num_rotations to be a positive integer, got -3"),
    ],
)
def test_other_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        assert_equivariant(_model("o2vit_square_tiny"), **kwargs)


def test_good_tolerances_are_accepted():
    model = _model("o2vit_square_tiny")
    assert assert_equivariant(model, tolerance=1e-8).passed
    assert assert_equivariant(model, "C4", tolerance=0.5).passed  # a subgroup of the declared group


class _OnSphere(nn.Module):
    """A field -> field map on icosphere level 1; ``mixing`` weights each vertex differently (not equivariant)."""

    def __init__(self, mixing: bool) -> None:
        super().__init__()
        self.domain, self.group, self.in_chans = icosphere_domain(1), get_group("I"), 2
        vertices = len(icosphere(1).vertices)
        gen = torch.Generator().manual_seed(0)
        weights = torch.rand(vertices, generator=gen, dtype=torch.float64) + 0.5 if mixing else torch.ones(vertices)
        self.register_buffer("weights", weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * self.weights


def test_still_fails_on_a_broken_model_and_passes_on_a_good_one():
    assert assert_equivariant(_OnSphere(mixing=False)).passed
    with pytest.raises(EquivarianceError) as info:
        assert_equivariant(_OnSphere(mixing=True))
    assert info.value.report.max_relative_error > 1e-3
    assert "FAIL" in str(info.value)


def test_explicit_input_action_skips_the_domain_checks():
    """A user's own action decides what the group acts on: no domain check then."""
    model = _OnSphere(mixing=True)
    assert assert_equivariant(model, "D4", input_action=lambda g, x: x, output_action="same").passed
