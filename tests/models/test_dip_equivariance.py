"""DiP's symmetries in float64: the denoiser's position output rotates with its frames (T, O, I), types are
invariant, translations leave the output unchanged and atom order permutes it; sampling from a rotated noise
stream gives the rotated molecules with the same types. Each check is also run on a deliberately broken
denoiser, which must fail it.

Broken denoisers (one module swapped each):

- ``unrotated``: the vector readout keeps each frame's vector in that frame's coordinates (its frame matrices
  replaced by identities), so the position output does not rotate back to the global frame;
- ``one_frame_types``: the type readout reads frame 0 instead of the frame mean, so types depend on orientation;
- ``absolute``: the positions are not centred before lifting, so a translation moves the features;
- ``indexed``: a bias per atom index is added to the tokens, so reordering the atoms changes the output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import randomise_
from torch import nn

import eqvit
from eqvit.diffusion import GaussianDiffusion, GaussianSource, Sampler
from eqvit.groups import get_group
from eqvit.testing import EquivarianceError, assert_equivariant

# embed_dim = |G| C with C = 4 (T), 2 (O, I): one head per frame of an even size
SIZES = {"T": 48, "O": 48, "I": 120}
TOL = 1e-10


def _model(group: str = "T", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = eqvit.create_model("dip_qm9_tiny", group=group, embed_dim=SIZES[group], num_points=5)
    return randomise_(model, seed=seed).double().eval()


def _inputs(batch: int = 2, atoms: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(batch, atoms, 3, generator=gen, dtype=torch.float64) * 1.5
    feat = torch.randn(batch, atoms, 5, generator=gen, dtype=torch.float64)
    return pos, feat, torch.rand(batch, generator=gen, dtype=torch.float64)


class _IdentityFrames(nn.Module):
    """Replaces a FrameVectorReadout's rotation back to the global frame by nothing (``unrotated``)."""

    def __init__(self, readout: nn.Module) -> None:
        super().__init__()
        self.readout = readout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.readout
        return r.proj(x.unflatten(-1, (r.order, r.channels))).mean(-2)


class _FirstFrame(nn.Module):
    """Reads the type scalars from frame 0 only (``one_frame_types``)."""

    def __init__(self, readout: nn.Module) -> None:
        super().__init__()
        self.readout = readout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.readout
        return r.proj(x.unflatten(-1, (r.order, r.channels))[..., 0, :])


class _IndexBias(nn.Module):
    """A bias per atom index on the lifted tokens (``indexed``)."""

    def __init__(self, tokenizer: nn.Module, width: int, atoms: int = 5) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.bias = nn.Parameter(torch.randn(atoms, width, generator=torch.Generator().manual_seed(3)))

    def forward(self, pos: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return self.tokenizer(pos, feat) + self.bias.to(pos.dtype)


class _Identity2(nn.Module):
    def forward(self, pos: torch.Tensor, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return pos, feat


def _broken(how: str, group: str = "T") -> nn.Module:
    model = _model(group)
    if how == "unrotated":
        model.head.vector = _IdentityFrames(model.head.vector)
    elif how == "one_frame_types":
        model.head.scalars = _FirstFrame(model.head.scalars)
    elif how == "absolute":
        model.input_encoding = _Identity2()
    elif how == "indexed":
        model.tokenizer = _IndexBias(model.tokenizer, model.embed_dim).double()
    else:
        raise AssertionError(how)
    return model


# ------------------------------------------------------------------------------------------------ the denoiser


def _rotation_errors(model: nn.Module, part: slice) -> list[float]:
    """Relative error of ``model(g x)[part]`` against ``g . model(x)[part]`` for every frame g."""
    x = _inputs()
    with torch.no_grad():
        y = model(*x)
        errors = []
        for g in model.frames.elements:
            expected = model.output_action(g, y)[..., part]
            got = model(*model.domain.act(g, x))[..., part]
            errors.append(((got - expected).abs().max() / expected.abs().max()).item())
    return errors


@pytest.mark.parametrize("group", ["T", "O", "I"])
def test_position_output_rotates_with_the_frames_and_types_are_invariant(group):
    model = _model(group)
    report = assert_equivariant(model, batch_size=2)  # float64, 1e-10: positions rotate, types stay
    assert len(report.rows) == get_group(group).order
    positions, types = _rotation_errors(model, slice(0, 3)), _rotation_errors(model, slice(3, None))
    assert max(positions) < TOL and max(types) < TOL
    with torch.no_grad():
        y = model(*_inputs())
    assert y[..., :3].abs().max() > 1e-2 and y[..., 3:].abs().max() > 1e-2  # neither part is vacuously zero


def test_unrotated_vector_readout_fails_the_rotation_check():
    model = _broken("unrotated")
    with pytest.raises(EquivarianceError):
        assert_equivariant(model, batch_size=2)
    assert max(_rotation_errors(model, slice(0, 3))) > 1e-2
    assert max(_rotation_errors(model, slice(3, None))) < TOL  # the types are still invariant


def test_types_read_from_one_frame_fail_the_invariance_check():
    model = _broken("one_frame_types")
    assert max(_rotation_errors(model, slice(0, 3))) < TOL
    assert max(_rotation_errors(model, slice(3, None))) > 1e-2


def _translation_error(model: nn.Module) -> float:
    pos, feat, t = _inputs()
    shift = torch.tensor([1.3, -0.7, 2.1], dtype=torch.float64)
    with torch.no_grad():
        y, moved = model(pos, feat, t), model(pos + shift, feat, t)
    return ((moved - y).abs().max() / y.abs().max()).item()


@pytest.mark.parametrize("group", ["T", "O", "I"])
def test_translations_leave_the_output_unchanged(group):
    assert _translation_error(_model(group)) < TOL


def test_uncentred_positions_fail_the_translation_check():
    assert _translation_error(_broken("absolute")) > 1e-2


def _permutation_error(model: nn.Module) -> float:
    pos, feat, t = _inputs()
    perm = torch.tensor([3, 0, 4, 1, 2])
    with torch.no_grad():
        y, shuffled = model(pos, feat, t), model(pos[:, perm], feat[:, perm], t)
    return ((shuffled - y[:, perm]).abs().max() / y.abs().max()).item()


@pytest.mark.parametrize("group", ["T", "O", "I"])
def test_atom_order_permutes_the_output(group):
    assert _permutation_error(_model(group)) < TOL


def test_index_dependent_tokens_fail_the_permutation_check():
    assert _permutation_error(_broken("indexed")) > 1e-2


def test_position_output_has_zero_centre_of_mass():
    with torch.no_grad():
        y = _model()(*_inputs())
    assert y[..., :3].mean(1).abs().max() < 1e-12


# ------------------------------------------------------------------------------------------------ sampling


class _RotatedSource(GaussianSource):
    """The same random stream with every position draw rotated by ``g`` (the type draws unchanged)."""

    def __init__(self, generator: torch.Generator, g: np.ndarray) -> None:
        super().__init__(generator)
        self.g = torch.from_numpy(np.array(g))

    def positions(self, shape, dtype, device):
        return super().positions(shape, dtype, device) @ self.g.to(dtype).T


def _sampling_error(model: nn.Module, kind: str, target: str) -> tuple[float, bool]:
    """Max relative error of the molecules sampled from the rotated stream against the rotated molecules, over
    the frames, and whether every type matched."""
    sampler = Sampler(GaussianDiffusion("polynomial", target=target, weighting="eps"), steps=6, kind=kind)
    pos, types = sampler.run(model, 2, 5, GaussianSource(torch.Generator().manual_seed(7)), torch.float64)
    worst, same_types = 0.0, True
    for g in model.frames.elements:
        turned, turned_types = sampler.run(
            model, 2, 5, _RotatedSource(torch.Generator().manual_seed(7), g), torch.float64
        )
        expected = pos @ torch.from_numpy(np.array(g)).T
        worst = max(worst, ((turned - expected).abs().max() / expected.abs().max()).item())
        same_types &= torch.equal(turned_types, types)
    return worst, same_types


@pytest.mark.parametrize("kind", ["ancestral", "ddim"])
@pytest.mark.parametrize("group", ["T", "O"])
def test_sampling_from_rotated_noise_gives_the_rotated_molecules(group, kind):
    error, same_types = _sampling_error(_model(group), kind, target="eps" if kind == "ancestral" else "x0")
    assert error < 1e-9 and same_types


def test_sampling_with_a_broken_denoiser_fails_the_rotation_check():
    error, _ = _sampling_error(_broken("unrotated"), "ddim", target="x0")
    assert error > 1e-2


def test_ddim_depends_on_the_initial_draw_only():
    """DDIM is deterministic after the first draw: a source whose later draws differ changes nothing."""
    model = _model()
    sampler = Sampler(GaussianDiffusion("linear", target="x0", weighting="velocity"), steps=4, kind="ddim")
    pos, _ = sampler.run(model, 1, 5, GaussianSource(torch.Generator().manual_seed(2)), torch.float64)

    class LaterNegated(GaussianSource):
        calls = 0

        def positions(self, shape, dtype, device):
            self.calls += 1
            draw = super().positions(shape, dtype, device)
            return draw if self.calls == 1 else -draw

    again, _ = sampler.run(model, 1, 5, LaterNegated(torch.Generator().manual_seed(2)), torch.float64)
    assert torch.equal(again, pos)
