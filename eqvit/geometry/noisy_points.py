"""Point clouds at a diffusion time: the input of a denoiser, ``(pos [B, N, d], feat [B, N, C], t [B])``.

A rotation acts on the positions only (the features are scalars, the time is a number per sample); the
denoiser's output ``[B, N, d + K]`` holds a vector per point (position noise or velocity), which rotates, and
``K`` invariant scalars per point (type noise): :class:`PointVectorAction`.
"""

from __future__ import annotations

import numpy as np
import torch

from eqvit.geometry.domain import PointCloudDomain, check_dtype


class NoisyPointCloudDomain(PointCloudDomain):
    """:class:`~eqvit.geometry.domain.PointCloudDomain` with a diffusion time ``t [B]`` per sample:
    models are called ``model(pos, feat, t)``.

    Args:
        dim: d, the dimension of the positions.
        num_points: N used by :meth:`random_input`.
    """

    def __init__(self, dim: int = 3, num_points: int = 64) -> None:
        super().__init__(dim, num_points)
        self.name = f"{dim}-D point clouds at a diffusion time"

    def __repr__(self) -> str:
        return f"NoisyPointCloudDomain(dim={self.dim})"

    def describe_input(self, channels: int | str = "C") -> str:
        return f"pos [B, N, {self.dim}], feat [B, N, {channels}], t [B] ({self.name})"

    def check(
        self,
        inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        channels: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """ValueError unless ``inputs`` is ``(pos [B, N, d], feat [B, N, channels], t [B])`` (of ``dtype``)."""
        if len(inputs) != 3:
            raise ValueError(f"expected three inputs (pos, feat, t), got {len(inputs)}")
        pos, feat, t = inputs
        super().check((pos, feat), channels, dtype)
        if t.ndim != 1 or t.shape[0] != pos.shape[0]:
            raise ValueError(f"expected t [B] with B = {pos.shape[0]} (one time per sample), got {list(t.shape)}")
        check_dtype(t, dtype, "t")

    def random_input(
        self, batch: int, channels: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Standard normal positions and features (as :class:`PointCloudDomain`), times uniform in [0, 1)."""
        pos, feat = super().random_input(batch, channels, generator, dtype)
        t = torch.rand(batch, generator=generator, dtype=torch.float64)
        return pos, feat, t.to(dtype)

    def act(
        self, matrix: np.ndarray, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotate (or reflect) every position by ``matrix``; features and times are unchanged."""
        pos, feat, t = inputs
        return (*super().act(matrix, (pos, feat)), t)


class PointVectorAction:
    """The action on per-point outputs ``[..., d + K]``: the first ``d`` channels are a vector (rotated by the
    matrix), the other ``K`` invariant scalars. ``action(matrix, y)``, as ``eqvit.testing`` takes it."""

    def __init__(self, dim: int = 3) -> None:
        self.dim = dim

    def __repr__(self) -> str:
        return f"vector [..., :{self.dim}] rotates, scalars [..., {self.dim}:] invariant"

    def __call__(self, matrix: np.ndarray, y: torch.Tensor) -> torch.Tensor:
        g = torch.as_tensor(np.array(matrix), dtype=y.dtype, device=y.device)
        return torch.cat([y[..., : self.dim] @ g.T, y[..., self.dim :]], dim=-1)
