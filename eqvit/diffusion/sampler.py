"""Sampling molecules from a trained denoiser: from ``z_1`` (noise) to ``t = 0`` on a uniform time grid.

Samplers (``kind``):

- ``"ancestral"``: draws ``z_s ~ q(z_s | z_t, x = x_hat)``, the Gaussian posterior of the forward process with the
  predicted clean molecule in place of the true one (DDPM; EDM's ``p(z_s | z_t)``). Mean
  ``alpha_{t|s} sigma_s^2 / sigma_t^2 z_t + alpha_s sigma_{t|s}^2 / sigma_t^2 x_hat``, variance
  ``sigma_{t|s}^2 sigma_s^2 / sigma_t^2``, with ``alpha_{t|s} = alpha_t / alpha_s`` and
  ``sigma_{t|s}^2 = sigma_t^2 - alpha_{t|s}^2 sigma_s^2``;
- ``"ddim"``: the deterministic ``z_s = alpha_s x_hat + sigma_s eps_hat`` (DDIM, Song et al. 2021). On the linear
  (flow-matching) schedule this is the Euler step of the flow's ODE, ADiT's sampler.

After the last step the network is evaluated once more at ``t = 0`` and its clean molecule is the sample (EDM);
the types are the argmax of the type part. Position noise is drawn in the zero centre-of-mass subspace.

Noise comes from a :class:`GaussianSource` (a ``torch.Generator`` behind two methods), so that a caller can
replace the random stream as a whole, e.g. by the same stream rotated (the equivariance tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from eqvit.diffusion.gaussian import GaussianDiffusion, remove_mean
from eqvit.utils import unknown_name_error

SAMPLERS = ("ancestral", "ddim")


class GaussianSource:
    """Standard normal draws for the sampler from one ``torch.Generator``: :meth:`positions` (zero centre of mass)
    and :meth:`types`. Subclasses may transform the stream (the tests rotate the positions)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def positions(self, shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``[B, N, d]`` standard normal, centred over the N points."""
        return remove_mean(torch.randn(shape, generator=self.generator, dtype=dtype).to(device))

    def types(self, shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``[B, N, K]`` standard normal."""
        return torch.randn(shape, generator=self.generator, dtype=dtype).to(device)


class Sampler:
    """Runs ``steps`` steps of sampler ``kind`` (module docstring) with a denoiser ``model(pos, feat, t)``.

    Args:
        diffusion: the process the model was trained on.
        steps: time steps from 1 to 0 (the model is called ``steps + 1`` times per batch).
        kind: ``"ancestral"`` or ``"ddim"``.
        num_types: K, the type channels.
    """

    def __init__(self, diffusion: GaussianDiffusion, steps: int = 500, kind: str = "ancestral", num_types: int = 5):
        if kind not in SAMPLERS:
            raise unknown_name_error("sampler", kind, SAMPLERS)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"expected sampling steps to be a positive integer, got {steps!r}")
        self.diffusion, self.steps, self.kind, self.num_types = diffusion, steps, kind, num_types
        self._step = self._ancestral if kind == "ancestral" else self._ddim

    def __repr__(self) -> str:
        return f"Sampler(kind={self.kind!r}, steps={self.steps})"

    def _ancestral(self, z, x_hat, eps_hat, t, s, source):
        schedule = self.diffusion.schedule
        (a_t, s_t), (a_s, s_s) = (tuple(v[:, None, None] for v in schedule.alpha_sigma(u)) for u in (t, s))
        a_ts = a_t / a_s
        var_ts = (s_t**2 - a_ts**2 * s_s**2).clamp_min(0)
        mean = a_ts * s_s**2 / s_t**2 * z + a_s * var_ts / s_t**2 * x_hat
        std = (var_ts * s_s**2 / s_t**2).sqrt()
        return mean + std * self._noise(z.shape, z, source)

    def _ddim(self, z, x_hat, eps_hat, t, s, source):
        a_s, s_s = (v[:, None, None] for v in self.diffusion.schedule.alpha_sigma(s))
        return a_s * x_hat + s_s * eps_hat

    def _noise(self, shape: torch.Size, like: torch.Tensor, source: GaussianSource) -> torch.Tensor:
        d = self.diffusion.dim
        B, N, _ = shape
        pos = source.positions((B, N, d), like.dtype, like.device)
        return torch.cat([pos, source.types((B, N, shape[-1] - d), like.dtype, like.device)], dim=-1)

    @torch.no_grad()
    def run(
        self, model: nn.Module, batch: int, num_atoms: int, source: GaussianSource, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` molecules of ``num_atoms`` atoms: ``(positions [B, N, d], types [B, N])`` (type indices).

        ``model`` is called in its current mode (put it in ``eval()``); the state starts at ``source``'s draw.
        """
        d = self.diffusion.dim
        device = next(model.parameters()).device
        z = self._noise((batch, num_atoms, d + self.num_types), torch.empty(0, dtype=dtype, device=device), source)
        grid = torch.linspace(1.0, 0.0, self.steps + 1, dtype=torch.float64)
        for k in range(self.steps):
            t, s = (torch.full((batch,), float(v), dtype=dtype, device=device) for v in (grid[k], grid[k + 1]))
            x_hat, eps_hat = self._predict(model, z, t)
            z = self.diffusion.project(self._step(z, x_hat, eps_hat, t, s, source))
        x_hat, _ = self._predict(model, z, torch.zeros(batch, dtype=dtype, device=device))
        return x_hat[..., :d], x_hat[..., d:].argmax(-1)

    def _predict(self, model: nn.Module, z: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.diffusion.dim
        return self.diffusion.predictions(model(z[..., :d], z[..., d:], t), z, t)

    def sample(
        self,
        model: nn.Module,
        counts: Sequence[int] | np.ndarray,
        source: GaussianSource,
        batch_size: int = 100,
        dtype: torch.dtype = torch.float32,
        progress: Callable[[int], None] | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """One molecule per entry of ``counts`` (atoms), in that order: ``(positions [n, d], types [n])`` numpy.

        Molecules of one atom count are sampled together in batches of at most ``batch_size`` (no padding, no
        mask); ``progress(k)`` is called after each batch with the molecules done in it.
        """
        counts = np.asarray(counts, dtype=np.int64)
        out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(counts)
        for n in np.unique(counts):
            rows = np.flatnonzero(counts == n)
            for start in range(0, len(rows), batch_size):
                part = rows[start : start + batch_size]
                pos, types = self.run(model, len(part), int(n), source, dtype)
                for r, p, h in zip(part, pos.double().cpu().numpy(), types.cpu().numpy()):
                    out[r] = (p, h)
                if progress is not None:
                    progress(len(part))
        return out
