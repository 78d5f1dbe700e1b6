"""Gaussian diffusion over molecules in data space (EDM's form; ADiT's flow-matching path as one schedule).

:mod:`~eqvit.diffusion.schedule` (``alpha(t)``, ``sigma(t)``), :mod:`~eqvit.diffusion.gaussian` (the forward
process, the training targets and the loss), :mod:`~eqvit.diffusion.sampler` (ancestral and DDIM / Euler).
"""

from eqvit.diffusion.gaussian import TARGETS, WEIGHTINGS, GaussianDiffusion, remove_mean
from eqvit.diffusion.sampler import SAMPLERS, GaussianSource, Sampler
from eqvit.diffusion.schedule import SCHEDULES, NoiseSchedule, make_schedule

__all__ = [
    "SAMPLERS",
    "SCHEDULES",
    "TARGETS",
    "WEIGHTINGS",
    "GaussianDiffusion",
    "GaussianSource",
    "NoiseSchedule",
    "Sampler",
    "make_schedule",
    "remove_mean",
]
