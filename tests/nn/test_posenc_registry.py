"""A new positional scheme is one registration: registered here, inside the test (no file of the package edited),
it builds into an O(2) model, a Platonic model and an SO3ViT, each exactly equivariant in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import randomise_
from torch import nn

import eqvit
from eqvit.nn.posenc import PositionalScheme, TokenLayout, list_posencs, register_posenc, unregister_posenc
from eqvit.testing import EquivarianceError, assert_equivariant


class RadialAPE(PositionalScheme):
    """``x + e(|p|)``: a learned profile of the distance of each token from the centre, added to the invariant
    coordinates only (the trivial irreps; the same channel in every frame; every channel of plain tokens), so the
    model keeps its symmetry. Plain tokens (SO3ViT) are at the centres of their poses, all at distance 1."""

    def __init__(self, layout: TokenLayout, breaks_symmetry: bool = False) -> None:
        super().__init__()
        points = layout.positions if layout.positions is not None else layout.poses[:, :, 2]
        radius = np.linalg.norm(points, axis=-1)
        if breaks_symmetry:  # a deliberately broken variant: it also reads the x coordinate
            radius = radius + points[:, 0]
        self.register_buffer("radius", torch.tensor(radius / radius.max(), dtype=torch.get_default_dtype()))
        ftype = layout.token_type
        if layout.basis == "irreps":
            index = ftype.trivial_index
        elif layout.basis == "frames":  # frames-major: channel c of frame g at g * C + c; one value per channel
            index = np.tile(np.arange(ftype.channels), ftype.group.order)
        else:
            index = np.arange(layout.embed_dim)
        # scatter [slots, embed_dim]: slot k's value goes to the coordinates it fills
        if layout.basis == "irreps":
            slots, rows, cols = len(index), np.arange(len(index)), index
        else:
            slots, rows, cols = int(index.max()) + 1, index, np.arange(layout.embed_dim)
        scatter = torch.zeros(slots, layout.embed_dim)
        scatter[torch.as_tensor(rows), torch.as_tensor(cols)] = 1.0
        self.register_buffer("scatter", scatter)
        self.profile = nn.Parameter(torch.randn(2, slots) * 0.5)

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        r = self.radius.to(x.dtype)[:, None]
        values = r * self.profile[0] + r * r * self.profile[1]  # [N, slots]
        return x + values @ self.scatter.to(x.dtype)


@pytest.fixture
def radial_ape():
    register_posenc("radial_ape", needs=("positions",))(lambda layout, **options: RadialAPE(layout))
    register_posenc("broken_radial_ape", needs=("positions",))(lambda layout, **options: RadialAPE(layout, True))
    yield "radial_ape"
    unregister_posenc("radial_ape")
    unregister_posenc("broken_radial_ape")


def _poses_as_positions(layout: TokenLayout, **options) -> PositionalScheme:
    return RadialAPE(layout)


MODELS = [("o2vit_square_tiny", {}), ("platonic_image_tiny", {"stream": "frames"}), ("so3vit_tiny", {})]


@pytest.mark.parametrize(("name", "kwargs"), MODELS, ids=[m for m, _ in MODELS])
def test_a_scheme_registered_in_a_test_builds_into_every_family(radial_ape, name, kwargs):
    if name == "so3vit_tiny":  # SO3ViT's tokens have poses, not positions: register for those too
        register_posenc("radial_ape", bases=("plain",), needs=("poses",))(_poses_as_positions)
    model = randomise_(eqvit.create_model(name, posenc=radial_ape, **kwargs))
    assert isinstance(model.posenc, RadialAPE) and model.config["posenc"] == "radial_ape"
    report = assert_equivariant(model, batch_size=1)  # float64, every element of the model's group
    assert report.passed and len(report.rows) == model.group.order


@pytest.mark.parametrize(("name", "kwargs"), MODELS[:2], ids=[m for m, _ in MODELS[:2]])
def test_a_scheme_that_breaks_the_symmetry_fails_the_check(radial_ape, name, kwargs):
    model = randomise_(eqvit.create_model(name, posenc="broken_radial_ape", **kwargs))
    with pytest.raises(EquivarianceError):
        assert_equivariant(model, batch_size=1)


def test_a_scheme_instance_is_used_as_it_is():
    scheme = eqvit.create_model("so3vit_tiny", posenc="learned").posenc
    model = eqvit.create_model("so3vit_tiny", posenc=scheme)
    assert model.posenc is scheme and model.config["posenc"] == "OrbitAPE"


def test_the_registry_lists_what_fits_the_tokens():
    assert {"none", "invariant_ape", "frame_rope", "so3rope", "learned", "ape"} <= set(list_posencs())
    grid = TokenLayout(8, 1, 8, eqvit.create_model("o2vit_square_tiny").token_type, positions=np.zeros((4, 2)))
    assert list_posencs(grid) == ["frame_rope", "invariant_ape", "none"]
    with pytest.raises(ValueError, match=r"unknown token bases or needs \['lattice'\]"):
        register_posenc("x", bases=("lattice",))
    with pytest.raises(KeyError, match="'nothing'"):
        unregister_posenc("nothing")
