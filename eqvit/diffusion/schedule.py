"""Noise schedules ``z_t = alpha(t) x + sigma(t) eps`` for t in [0, 1] (0: data, 1: noise), continuous time.

- ``"polynomial"``: EDM's default (Hoogeboom et al. 2022, ``polynomial_2``): ``alpha^2 = (1 - 2s)(1 - t^2)^2 + s``,
  ``sigma^2 = 1 - alpha^2`` (variance preserving), ``s = 1e-5`` so that neither ever reaches 0;
- ``"cosine"``: Nichol and Dhariwal (2021), ``alpha = cos(pi/2 (t + o)/(1 + o)) / cos(pi/2 o/(1 + o))`` with
  ``o = 0.008``, variance preserving, ``alpha^2`` kept within ``[s, 1 - s]``;
- ``"linear"``: the straight path of flow matching / rectified flow that ADiT (Joshi et al. 2025) trains on,
  ``alpha = 1 - (1 - s) t``, ``sigma = s + (1 - s) t`` with ``s = 1e-3`` (not variance preserving).

Every schedule has ``sigma / alpha`` increasing in t, so the forward process is Markov and the ancestral
sampler's posterior variances are non-negative.
"""

from __future__ import annotations

import math

import torch

from eqvit.utils import unknown_name_error

SCHEDULES = ("polynomial", "cosine", "linear")


class NoiseSchedule:
    """``alpha(t)``, ``sigma(t)`` for ``t`` in [0, 1]; computed in float64 and returned in ``t``'s dtype."""

    name = ""

    def alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(alpha, sigma)``, each shaped like ``t``."""
        a, s = self._alpha_sigma(t.to(torch.float64))
        return a.to(t.dtype), s.to(t.dtype)

    def _alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PolynomialSchedule(NoiseSchedule):
    """EDM's ``polynomial_2`` (module docstring)."""

    name = "polynomial"

    def __init__(self, power: float = 2.0, precision: float = 1e-5) -> None:
        self.power, self.precision = power, precision

    def _alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.precision
        alpha2 = (1 - 2 * s) * (1 - t.clamp(0, 1) ** self.power) ** 2 + s
        return alpha2.sqrt(), (1 - alpha2).sqrt()


class CosineSchedule(NoiseSchedule):
    """Nichol and Dhariwal's cosine schedule (module docstring)."""

    name = "cosine"

    def __init__(self, offset: float = 0.008, precision: float = 1e-5) -> None:
        self.offset, self.precision = offset, precision

    def _alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o, s = self.offset, self.precision
        alpha = torch.cos(0.5 * math.pi * (t.clamp(0, 1) + o) / (1 + o)) / math.cos(0.5 * math.pi * o / (1 + o))
        alpha2 = (alpha**2).clamp(s, 1 - s)
        return alpha2.sqrt(), (1 - alpha2).sqrt()


class LinearSchedule(NoiseSchedule):
    """The flow-matching path (module docstring)."""

    name = "linear"

    def __init__(self, precision: float = 1e-3) -> None:
        self.precision = precision

    def _alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, t = self.precision, t.clamp(0, 1)
        return 1 - (1 - s) * t, s + (1 - s) * t


def make_schedule(name: str) -> NoiseSchedule:
    """The schedule called ``name`` (:data:`SCHEDULES`); an unknown name lists the valid ones."""
    classes = {"polynomial": PolynomialSchedule, "cosine": CosineSchedule, "linear": LinearSchedule}
    if name not in classes:
        raise unknown_name_error("noise schedule", name, SCHEDULES)
    return classes[name]()
