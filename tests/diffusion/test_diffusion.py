"""The Gaussian diffusion of eqvit.diffusion: schedules, targets, loss weights, and the samplers driven by an
oracle that knows the clean molecule (both samplers must then return it)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eqvit.diffusion import (
    SCHEDULES,
    TARGETS,
    GaussianDiffusion,
    GaussianSource,
    Sampler,
    make_schedule,
    remove_mean,
)
from eqvit.diffusion.gaussian import VELOCITY_SIGMA_FLOOR

T = torch.linspace(0, 1, 101, dtype=torch.float64)


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedules_go_from_data_to_noise_with_rising_noise_to_signal(name):
    alpha, sigma = make_schedule(name).alpha_sigma(T)
    assert alpha[0] > 0.99 and sigma[0] < 0.01 and alpha[-1] < 0.01 and sigma[-1] > 0.99
    assert (alpha > 0).all() and (sigma > 0).all()  # never exactly 0: x_hat and eps_hat stay defined
    assert (torch.diff(sigma / alpha) > 0).all()  # the forward process is Markov
    if name != "linear":  # variance preserving
        torch.testing.assert_close(alpha**2 + sigma**2, torch.ones_like(T), rtol=0, atol=1e-12)
    else:
        torch.testing.assert_close(alpha + sigma, torch.full_like(T, 1 + 1e-3), rtol=0, atol=1e-12)  # a straight path


def test_polynomial_schedule_is_edms():
    alpha, _ = make_schedule("polynomial").alpha_sigma(torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64))
    s = 1e-5
    expected = ((1 - 2 * s) * (1 - torch.tensor([0.0, 0.25, 1.0], dtype=torch.float64)) ** 2 + s).sqrt()
    torch.testing.assert_close(alpha, expected, rtol=0, atol=1e-15)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match="polynomial"):
        make_schedule("polynomal")
    with pytest.raises(ValueError, match="x0"):
        GaussianDiffusion(target="x1")
    with pytest.raises(ValueError, match="velocity"):
        GaussianDiffusion(weighting="v")
    with pytest.raises(ValueError, match="ddim"):
        Sampler(GaussianDiffusion(), kind="euler")
    with pytest.raises(ValueError, match="positive integer"):
        Sampler(GaussianDiffusion(), steps=0)


def _state(batch: int = 3, atoms: int = 6, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(batch, atoms, 3, generator=gen, dtype=torch.float64)
    types = torch.nn.functional.one_hot(torch.randint(0, 5, (batch, atoms), generator=gen), 5).double()
    return GaussianDiffusion().encode(pos, types)


def test_encode_centres_and_scales_and_noise_has_zero_centre_of_mass():
    diffusion = GaussianDiffusion(type_scale=0.25)
    state = _state()
    assert state[..., :3].mean(1).abs().max() < 1e-12
    assert set(state[..., 3:].unique().tolist()) == {0.0, 0.25}
    eps = diffusion.noise_like(state, torch.Generator().manual_seed(1))
    assert eps[..., :3].mean(1).abs().max() < 1e-12 and eps[..., 3:].mean(1).abs().max() > 1e-3


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_predictions_invert_the_forward_process(schedule, target):
    diffusion = GaussianDiffusion(schedule, target=target)
    state = _state()
    eps = diffusion.noise_like(state, torch.Generator().manual_seed(1))
    t = torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)
    (z_x, z_h, _), packed = diffusion.training_pair(state, t, eps)
    z = torch.cat([z_x, z_h], dim=-1)
    alpha, sigma = (v[:, None, None] for v in make_schedule(schedule).alpha_sigma(t))
    exact = {"eps": eps, "x0": state, "v": alpha * eps - sigma * state}[target]
    torch.testing.assert_close(packed[..., :-1], exact)
    x_hat, eps_hat = diffusion.predictions(exact, z, t)
    torch.testing.assert_close(x_hat, state, rtol=0, atol=1e-9)
    torch.testing.assert_close(eps_hat, eps, rtol=0, atol=1e-9)
    assert diffusion.loss(exact, packed).item() == 0.0
    assert diffusion.loss(exact + 0.1, packed).item() > 0.0


def test_loss_weights():
    t = torch.tensor([0.01, 0.3, 0.7, 0.99], dtype=torch.float64)
    alpha, sigma = make_schedule("linear").alpha_sigma(t)
    torch.testing.assert_close(GaussianDiffusion("linear", "eps", "eps").loss_weight(t), torch.ones_like(t))
    assert torch.equal(GaussianDiffusion("linear", "x0", "x0").loss_weight(t), torch.ones_like(t))
    torch.testing.assert_close(GaussianDiffusion("linear", "x0", "eps").loss_weight(t), alpha**2 / sigma**2)
    # ADiT: the clean-molecule error divided by max(sigma, 0.1), squared
    velocity = GaussianDiffusion("linear", "x0", "velocity").loss_weight(t)
    torch.testing.assert_close(velocity, 1 / sigma.clamp_min(VELOCITY_SIGMA_FLOOR) ** 2)
    assert velocity[0] == pytest.approx(100.0)
    # eps target with x0 weighting: the network's error is alpha/sigma times the implied x0 error
    torch.testing.assert_close(GaussianDiffusion("linear", "eps", "x0").loss_weight(t), sigma**2 / alpha**2)
    # v = alpha eps - sigma x: its error is (alpha^2 + sigma^2) / sigma times the x0 error
    v = GaussianDiffusion("linear", "v", "velocity").loss_weight(t)
    torch.testing.assert_close(v, (sigma / (alpha**2 + sigma**2)) ** 2 / sigma.clamp_min(VELOCITY_SIGMA_FLOOR) ** 2)


class _Oracle(nn.Module):
    """A "denoiser" that knows the clean molecule: outputs its clean state (x0) or the exact noise (eps)."""

    def __init__(self, state: torch.Tensor, diffusion: GaussianDiffusion) -> None:
        super().__init__()
        self.state, self.diffusion = state, diffusion
        self.anchor = nn.Parameter(torch.zeros((), dtype=state.dtype))  # the sampler reads the device from it

    def forward(self, pos: torch.Tensor, feat: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        z = torch.cat([pos, feat], dim=-1)
        if self.diffusion.target == "x0":
            return self.state.expand_as(z)
        alpha, sigma = (v[:, None, None] for v in self.diffusion.schedule.alpha_sigma(t))
        return (z - alpha * self.state) / sigma


@pytest.mark.parametrize(("schedule", "target", "kind"), [("polynomial", "eps", "ancestral"), ("linear", "x0", "ddim")])
def test_samplers_return_the_molecule_an_oracle_knows(schedule, target, kind):
    diffusion = GaussianDiffusion(schedule, target=target)
    state = _state(batch=1, atoms=5)
    sampler = Sampler(diffusion, steps=8, kind=kind)
    source = GaussianSource(torch.Generator().manual_seed(0))
    pos, types = sampler.run(_Oracle(state, diffusion), 2, 5, source, torch.float64)
    assert pos.shape == (2, 5, 3) and types.shape == (2, 5)
    torch.testing.assert_close(pos, state[..., :3].expand(2, -1, -1), rtol=0, atol=1e-9)
    assert torch.equal(types, state[..., 3:].argmax(-1).expand(2, -1))


def test_sample_keeps_the_order_of_the_counts_and_batches_by_count():
    diffusion = GaussianDiffusion()
    calls = []

    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = nn.Parameter(torch.zeros(()))

        def forward(self, pos, feat, t):
            calls.append(tuple(pos.shape[:2]))
            return torch.zeros(*pos.shape[:2], 8)

    molecules = Sampler(diffusion, steps=2).sample(
        Recorder(), [4, 3, 4, 4, 3], GaussianSource(torch.Generator().manual_seed(0)), batch_size=2
    )
    assert [len(types) for _, types in molecules] == [4, 3, 4, 4, 3]
    assert sorted(set(calls)) == [(1, 4), (2, 3), (2, 4)]  # one count per batch, at most 2 molecules


def test_remove_mean():
    x = torch.randn(2, 4, 3)
    torch.testing.assert_close(remove_mean(x).mean(1), torch.zeros(2, 3), rtol=0, atol=1e-6)
