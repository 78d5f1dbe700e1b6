"""Tasks: what the engine trains on, how it scores, and what it plots.

A task owns the data for one model's domain and exposes ``train_batch()``, ``loss()``,
``evaluate()`` and ``plot_error_map()``. The shallow-water task serves SO3ViT (icosphere
vertices) and the S2Transformer baseline (lat-lon grid) with the same dynamics.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from eqvit.train.config import DataConfig
from eqvit.utils import unknown_name_error


def default_cache_dir(cfg: DataConfig) -> Path:
    """Where fixed validation sets are cached: ``data.cache_dir``, ``$EQVIT_CACHE`` or ~/.cache/eqvit."""
    return Path(cfg.cache_dir or os.environ.get("EQVIT_CACHE", "~/.cache/eqvit")).expanduser() / cfg.name


class ShallowWaterTask:
    """Next-hour prediction of the shallow-water state (normalised fields, 3 channels).

    Args:
        cfg: the data section of the experiment config.
        model: the model to train; its ``domain`` decides points (``[V]``) or grid (``[nlat, nlon]``).
        device: where batches go.
    """

    def __init__(self, cfg: DataConfig, model: nn.Module, device: torch.device) -> None:
        from eqvit.data.shallow_water import ShallowWaterConfig, ShallowWaterData
        from eqvit.train.metrics import latlon_quadrature_weights

        self.cfg, self.device = cfg, device
        domain = model.domain
        if domain is None:
            raise ValueError(f"model {type(model).__name__} has no .domain; shallow water needs one")
        self.on_grid = tuple(domain.shape) == (cfg.nlat, cfg.nlon)
        self.kind = "grid" if self.on_grid else "points"
        sw_cfg = ShallowWaterConfig(
            nlat=cfg.nlat,
            nlon=cfg.nlon,
            dt_hours=cfg.dt_hours,
            mach=cfg.mach,
            seed=cfg.seed,
            steps_per_trajectory=cfg.steps_per_trajectory,
        )
        points = None if self.on_grid else torch.from_numpy(np.array(domain.points))
        self.data = ShallowWaterData(sw_cfg, points=points)
        if self.on_grid:
            weights = latlon_quadrature_weights(cfg.nlat, cfg.nlon)
            colat = torch.acos(torch.from_numpy(np.array(domain.points))[:, 2].clamp(-1, 1))
            self.latitudes = (np.pi / 2 - colat).reshape(cfg.nlat, cfg.nlon)[:, 0]
        else:
            if domain.weights is None:
                raise ValueError(f"{domain.name} has no quadrature weights")
            weights = torch.from_numpy(np.array(domain.weights))
            self.latitudes = None
        self.points = torch.from_numpy(np.array(domain.points))
        self.weights = weights.to(torch.float64)
        self._loss_weights = (self.weights / self.weights.sum()).float().to(device)
        self.validation = self.data.validation_set(cfg.num_val, seed=cfg.seed + 10_000, cache_dir=default_cache_dir(cfg))

    def train_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.data.next_batch(self.cfg.batch_size, self.kind)
        return x.to(self.device), y.to(self.device)

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Quadrature-weighted mean squared error over the sphere, channels and batch."""
        err = (pred - target).pow(2).mean(dim=(0, 1))
        return (err * self._loss_weights).sum()

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None) -> dict[str, Any]:
        """Relative L1/L2 (quadrature weighted, per channel and mean), error map, polar ratio.

        ``model=None`` scores persistence (predict the input).
        """
        from eqvit.train.metrics import SphereErrorMap, polar_error_ratio, relative_lp_error

        was_training = model.training if model is not None else False
        if model is not None:
            model.eval()
        sums = {"l1": 0.0, "l2": 0.0}
        per_channel = {"l1": 0.0, "l2": 0.0}
        error_map = SphereErrorMap(kind="abs")
        count = 0
        for x, y in self.validation.batches(self.cfg.val_batch_size, self.kind):
            x, y = x.to(self.device), y.to(self.device)
            pred = x if model is None else model(x)
            pred, y = pred.double().cpu(), y.double().cpu()
            for p, key in ((1, "l1"), (2, "l2")):
                err = relative_lp_error(pred, y, self.weights, p=p, reduction="none")  # [B, C]
                sums[key] += err.mean(dim=1).sum().item()
                per_channel[key] = per_channel[key] + err.sum(dim=0)
            error_map.update(pred, y)
            count += len(x)
        if model is not None and was_training:
            model.train()
        emap = error_map.compute()
        where = self.latitudes if self.on_grid else self.points
        return {
            "rel_l1": sums["l1"] / count,
            "rel_l2": sums["l2"] / count,
            "rel_l1_per_channel": (per_channel["l1"] / count).tolist(),
            "rel_l2_per_channel": (per_channel["l2"] / count).tolist(),
            "polar_error_ratio": float(polar_error_ratio(emap, where, self.weights)),
            "error_map": emap,
        }

    def plot_error_map(self, error_map: torch.Tensor, path: Path, title: str) -> None:
        """Mean absolute error over the validation set, drawn in longitude/latitude."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.2))
        values = error_map.numpy()
        if self.on_grid:
            im = ax.imshow(values, extent=(0, 360, -90, 90), aspect="auto", cmap="magma")
        else:
            p = self.points.numpy()
            lon = np.degrees(np.arctan2(p[:, 1], p[:, 0])) % 360
            lat = np.degrees(np.arcsin(np.clip(p[:, 2], -1, 1)))
            im = ax.scatter(lon, lat, c=values, s=4, cmap="magma", linewidths=0)
            ax.set_xlim(0, 360)
            ax.set_ylim(-90, 90)
        ax.axhline(60, color="w", lw=0.6, ls="--")
        ax.axhline(-60, color="w", lw=0.6, ls="--")
        ax.set_xlabel("longitude [deg]")
        ax.set_ylabel("latitude [deg]")
        ax.set_title(title)
        fig.colorbar(im, ax=ax, label="mean |error| (normalised units)")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


TASKS = {"shallow_water": ShallowWaterTask}


def build_task(cfg: DataConfig, model: nn.Module, device: torch.device):
    if cfg.name not in TASKS:
        raise unknown_name_error("data task", cfg.name, TASKS)
    return TASKS[cfg.name](cfg, model, device)
