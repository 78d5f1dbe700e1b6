"""Gaussian diffusion over molecules in data space: positions in the zero centre-of-mass subspace and atom types.

A molecule is ``x [N, 3]`` (centred, Å) and ``h [N, K]`` (one-hot types times ``type_scale``, EDM's 0.25). The
forward process is ``z_t = alpha(t) (x, h) + sigma(t) (eps_x, eps_h)`` (:mod:`eqvit.diffusion.schedule`), with
``eps_x`` standard normal projected to zero centre of mass (EDM, Hoogeboom et al. 2022): the positions stay in the
subspace where an E(3)- or G-equivariant model defines a translation-invariant density.

The denoiser's output ``[B, N, 3 + K]`` is read as ``target``: ``"eps"`` (the noise, EDM), ``"x0"`` (the clean
molecule, ADiT) or ``"v"`` (``v = alpha eps - sigma x``, Salimans and Ho 2022; then
``x = (alpha z - sigma v) / (alpha^2 + sigma^2)``, so near the data the clean molecule is ``z`` plus a correction,
as with ``eps``, and near the noise it is the network's output, as with ``x0``). The loss is a squared error
weighted per sample by ``weighting``, expressed on the error of the clean molecule ``|x - x_hat|^2``:

- ``"eps"``: ``alpha^2 / sigma^2`` (the noise error, EDM's L_simple);
- ``"x0"``: 1;
- ``"velocity"``: ``1 / max(sigma, 0.1)^2`` (the velocity error of flow matching, ADiT's floor at 0.1).

The network's error is ``c`` times the implied clean-molecule error, ``c = sigma / alpha`` for ``eps``, 1 for
``x0`` and ``sigma / (alpha^2 + sigma^2)`` for ``v``, so the weight on the network's error is ``weighting * c^2``
(1 for eps / eps).
"""

from __future__ import annotations

import torch

from eqvit.diffusion.schedule import NoiseSchedule, make_schedule
from eqvit.utils import unknown_name_error

TARGETS = ("eps", "x0", "v")
WEIGHTINGS = ("eps", "x0", "velocity")
VELOCITY_SIGMA_FLOOR = 0.1  # ADiT: the flow-matching error divided by max(1 - t, 0.1)


def remove_mean(x: torch.Tensor) -> torch.Tensor:
    """``x [B, N, d]`` with its mean over the N points removed (the zero centre-of-mass projection)."""
    return x - x.mean(dim=1, keepdim=True)


class GaussianDiffusion:
    """The process, its training targets and its predictions (module docstring).

    Args:
        schedule: a :class:`~eqvit.diffusion.schedule.NoiseSchedule` or its name.
        target: what the network predicts, ``"eps"``, ``"x0"`` or ``"v"``.
        weighting: the loss weighting, ``"eps"``, ``"x0"`` or ``"velocity"``.
        type_scale: the one-hot types are multiplied by it (EDM: 0.25).
        dim: d, the dimension of the positions.
    """

    def __init__(
        self,
        schedule: NoiseSchedule | str = "polynomial",
        target: str = "eps",
        weighting: str = "eps",
        type_scale: float = 0.25,
        dim: int = 3,
    ) -> None:
        if target not in TARGETS:
            raise unknown_name_error("diffusion target", target, TARGETS)
        if weighting not in WEIGHTINGS:
            raise unknown_name_error("loss weighting", weighting, WEIGHTINGS)
        if not type_scale > 0:
            raise ValueError(f"expected type_scale > 0, got {type_scale!r}")
        self.schedule = make_schedule(schedule) if isinstance(schedule, str) else schedule
        self.target, self.weighting, self.type_scale, self.dim = target, weighting, type_scale, dim

    def __repr__(self) -> str:
        return (
            f"GaussianDiffusion(schedule={self.schedule.name!r}, target={self.target!r}, "
            f"weighting={self.weighting!r}, type_scale={self.type_scale})"
        )

    # ------------------------------------------------------------------ the forward process
    def encode(self, positions: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """``x [B, N, d]``, one-hot ``[B, N, K]`` -> the clean state ``[B, N, d + K]`` (centred, types scaled)."""
        return torch.cat([remove_mean(positions), onehot * self.type_scale], dim=-1)

    def noise_like(self, state: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Standard normal noise ``[B, N, d + K]``, its position part projected to zero centre of mass."""
        eps = torch.randn(state.shape, generator=generator, dtype=state.dtype, device=state.device)
        return self.project(eps)

    def project(self, state: torch.Tensor) -> torch.Tensor:
        """``[B, N, d + K]`` with the positions' centre of mass removed."""
        return torch.cat([remove_mean(state[..., : self.dim]), state[..., self.dim :]], dim=-1)

    def corrupt(self, state: torch.Tensor, eps: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``z_t = alpha(t) state + sigma(t) eps``; ``state, eps [B, N, d + K]``, ``t [B]``."""
        alpha, sigma = self.schedule.alpha_sigma(t)
        return alpha[:, None, None] * state + sigma[:, None, None] * eps

    # ------------------------------------------------------------------ training
    def loss_weight(self, t: torch.Tensor) -> torch.Tensor:
        """``[B]``: the weight of the squared error of the network's output at times ``t``."""
        alpha, sigma = self.schedule.alpha_sigma(t.to(torch.float64))
        on_x0 = {
            "eps": alpha**2 / sigma**2,
            "x0": torch.ones_like(alpha),
            "velocity": 1 / sigma.clamp_min(VELOCITY_SIGMA_FLOOR) ** 2,
        }[self.weighting]
        scale = {"eps": sigma / alpha, "x0": torch.ones_like(alpha), "v": sigma / (alpha**2 + sigma**2)}[self.target]
        return (on_x0 * scale**2).to(t.dtype)

    def training_pair(
        self, state: torch.Tensor, t: torch.Tensor, eps: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """Clean ``state [B, N, d + K]`` at times ``t [B]`` with noise ``eps`` (:meth:`noise_like`) -> the model's
        inputs ``(z_x [B, N, d], z_h [B, N, K], t)`` and the packed target ``[B, N, d + K + 1]``: the network's
        regression target (``eps`` or the clean state) and, in the last channel, the sample's loss weight (repeated
        over its atoms)."""
        z = self.corrupt(state, eps, t)
        alpha, sigma = (v[:, None, None] for v in self.schedule.alpha_sigma(t))
        goal = {"eps": eps, "x0": state, "v": alpha * eps - sigma * state}[self.target]
        weight = self.loss_weight(t)[:, None, None].expand(*state.shape[:2], 1)
        return (z[..., : self.dim], z[..., self.dim :], t), torch.cat([goal, weight], dim=-1)

    @staticmethod
    def loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Weighted mean squared error: ``pred [B, N, d + K]`` against :meth:`training_pair`'s packed target."""
        goal, weight = target[..., :-1], target[..., -1:]
        return (weight * (pred - goal) ** 2).mean()

    # ------------------------------------------------------------------ sampling
    def predictions(self, output: torch.Tensor, z: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The network's ``output [B, N, d + K]`` at ``z_t``, ``t [B]`` -> ``(x_hat, eps_hat)``, each ``[B, N, d + K]``:
        the clean molecule and the noise it implies."""
        alpha, sigma = (v[:, None, None] for v in self.schedule.alpha_sigma(t))
        if self.target == "eps":
            return (z - sigma * output) / alpha, output
        if self.target == "x0":
            return output, (z - alpha * output) / sigma
        norm = alpha**2 + sigma**2
        return (alpha * z - sigma * output) / norm, (sigma * z + alpha * output) / norm
