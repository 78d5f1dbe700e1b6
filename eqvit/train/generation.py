"""QM9 molecule generation as a :class:`~eqvit.train.tasks.Task` (``data.name: qm9_generation``).

A denoiser ``model(pos [B, N, 3], feat [B, N, 5], t [B])`` (``dip_qm9_*``) learns to reverse the Gaussian diffusion
of ``data.diffusion`` (:mod:`eqvit.diffusion`) over whole molecules with explicit hydrogens. Each training
batch holds molecules of one atom count (buckets of the training split, shuffled per epoch with ``data.seed``),
rotated at random (``data.train_rotate``: ``so3`` for Haar-uniform rotations, ``z`` or ``none``), centred, each
at a uniform random time with fresh noise; the draws are seeded by the step, so resuming restores the stream.

Evaluation: ``val_loss``, the same weighted loss on the first ``data.eval_subset`` validation molecules (default
1,000) at fixed times and noise, so that evaluations compare; with ``diffusion.eval_samples`` > 0 also the atom
and molecule stability (EDM) of that many sampled molecules. The baseline is the zero output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from eqvit.geometry.noisy_points import NoisyPointCloudDomain
from eqvit.train.config import DataConfig, DiffusionConfig
from eqvit.train.regression import QM9NotInstalledError, same_count_batches
from eqvit.train.reporting import Column, MetricReport

DEFAULT_EVAL_SUBSET = 1000


def make_diffusion(cfg: DiffusionConfig):
    """The :class:`~eqvit.diffusion.GaussianDiffusion` of ``data.diffusion``."""
    from eqvit.diffusion import GaussianDiffusion

    return GaussianDiffusion(cfg.schedule, cfg.target, cfg.weighting, cfg.type_scale)


def make_sampler(cfg: DiffusionConfig, steps: int | None = None):
    """The :class:`~eqvit.diffusion.Sampler` of ``data.diffusion`` (``steps`` overrides its own)."""
    from eqvit.diffusion import Sampler

    return Sampler(make_diffusion(cfg), steps or cfg.steps, cfg.sampler)


class QM9GenerationTask(MetricReport):
    """Denoising on QM9 (module docstring); the process is ``data.diffusion``."""

    baseline_name = "zero_output"
    monitor, monitor_mode = "val_loss", "min"
    loss_label, loss_log_scale = "train loss (weighted denoising MSE)", True
    curve_label = "validation denoising loss"
    headline_label = "validation denoising loss"
    report_columns = (
        Column("val_loss", "val loss"),
        Column("atom_stability", "atom stab.", ".1f", 100.0, "%"),
        Column("molecule_stability", "mol. stab.", ".1f", 100.0, "%"),
    )

    def __init__(self, cfg: DataConfig, model: nn.Module, device: torch.device) -> None:
        from eqvit.data.qm9 import ELEMENTS, qm9_splits
        from eqvit.data.qm9_generation import ROTATIONS, AtomCounts

        self.cfg, self.device = cfg, torch.device(device)
        self.diffusion_cfg = cfg.diffusion
        in_chans = getattr(model, "in_chans", None)
        domain = getattr(model, "domain", None)
        if not isinstance(domain, NoisyPointCloudDomain) or in_chans != len(ELEMENTS) or domain.dim != 3:
            takes = domain.describe_input(in_chans) if hasattr(domain, "describe_input") else "no declared input"
            raise ValueError(
                f"data.name 'qm9_generation' needs a denoiser called as model(pos [B, N, 3], feat [B, N, "
                f"{len(ELEMENTS)}], t [B]) (dip_qm9_*); this model takes {takes}"
            )
        if cfg.train_rotate not in ROTATIONS:
            raise ValueError(f"data.train_rotate: expected one of {', '.join(ROTATIONS)}, got {cfg.train_rotate!r}")
        try:
            splits = qm9_splits(cfg.split_seed, root=cfg.root, cache_dir=cfg.cache_dir)
        except ModuleNotFoundError as err:
            raise QM9NotInstalledError(str(err)) from None
        train = splits["train"]
        if cfg.sample_ratio < 1:
            keep = max(1, round(cfg.sample_ratio * len(train)))
            ids = np.sort(np.random.default_rng(cfg.split_seed).permutation(len(train))[:keep])
            train = type(train)(train.arrays, train.ids[ids], "train")
        val = splits["val"]
        val = type(val)(val.arrays, val.ids[: cfg.eval_subset or DEFAULT_EVAL_SUBSET], "val")
        self.splits = {"train": train, "val": val, "test": splits["test"]}
        self.counts = AtomCounts(train.num_atoms)
        self.diffusion = make_diffusion(self.diffusion_cfg)
        self.steps_per_epoch = len(same_count_batches(train.num_atoms, cfg.batch_size, None))
        self.position = 0
        self._order: tuple[int, list[np.ndarray]] | None = None
        self._validation = self._fixed_validation()

    # ------------------------------------------------------------------ data
    def state(self, split: str, rows: np.ndarray, rotations: torch.Tensor | None = None) -> torch.Tensor:
        """The clean states ``[B, n, 3 + 5]`` (centred positions, scaled one-hot types) of ``rows`` of ``split``,
        each rotated by ``rotations [B, 3, 3]`` when given."""
        from eqvit.data.qm9_generation import molecules_batch

        pos, onehot = molecules_batch(self.splits[split], rows)
        pos = torch.from_numpy(pos)
        if rotations is not None:
            pos = pos @ rotations.transpose(1, 2)
        return self.diffusion.encode(pos.float(), torch.from_numpy(onehot)).to(self.device)

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        if self._order is None or self._order[0] != epoch:
            rng = np.random.default_rng([self.cfg.seed, epoch])
            batches = same_count_batches(self.splits["train"].num_atoms, self.cfg.batch_size, rng)
            self._order = (epoch, batches)
        return self._order[1]

    def train_batch(self) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        from eqvit.data.qm9_generation import random_rotations

        epoch, b = divmod(self.position, self.steps_per_epoch)
        rows = self._epoch_batches(epoch)[b]
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.position)
        self.position += 1
        state = self.state("train", rows, random_rotations(self.cfg.train_rotate, len(rows), generator))
        t = torch.rand(len(rows), generator=generator).to(self.device)
        noise = self.diffusion.noise_like(torch.empty(state.shape), generator).to(self.device)
        return self.diffusion.training_pair(state, t, noise)

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.diffusion.loss(pred, target)

    def data_state(self) -> torch.Tensor:
        return torch.tensor([self.position], dtype=torch.int64)

    def load_data_state(self, state: torch.Tensor) -> None:
        self.position = int(state.reshape(-1)[0])

    # ------------------------------------------------------------------ scores
    def _fixed_validation(self) -> list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
        """The validation batches with their times and noise drawn once (seeded), so evaluations compare."""
        generator = torch.Generator().manual_seed(10_000 + self.cfg.seed)
        batches = []
        for rows in same_count_batches(self.splits["val"].num_atoms, self.cfg.val_batch_size, None):
            state = self.state("val", rows)
            t = torch.rand(len(rows), generator=generator).to(self.device)
            noise = self.diffusion.noise_like(torch.empty(state.shape), generator).to(self.device)
            batches.append(self.diffusion.training_pair(state, t, noise))
        return batches

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None) -> dict[str, Any]:
        """``val_loss`` (and, with ``diffusion.eval_samples``, the stability of sampled molecules); ``model=None``
        scores the zero output."""
        total = count = 0.0
        was_training = model.training if model is not None else False
        if model is not None:
            model.eval()
        for inputs, target in self._validation:
            pred = torch.zeros_like(target[..., :-1]) if model is None else model(*inputs).float()
            total += self.loss(pred, target).item() * len(target)
            count += len(target)
        out: dict[str, Any] = {"val_loss": total / count}
        if model is not None and self.diffusion_cfg.eval_samples:
            out.update(self.sample_stability(model, self.diffusion_cfg.eval_samples))
        if model is not None:
            model.train(was_training)
        return out

    def sample_stability(self, model: nn.Module, num: int, seed: int = 0) -> dict[str, float]:
        """Atom and molecule stability of ``num`` molecules sampled with ``diffusion.eval_steps`` steps."""
        from eqvit.chem.bonds import stability

        molecules = self.sample(model, num, seed, steps=self.diffusion_cfg.eval_steps)
        return stability(molecules)

    def sample(
        self, model: nn.Module, num: int, seed: int = 0, steps: int | None = None, progress: Any = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """``num`` molecules ``(positions [n, 3], types [n])``: atom counts drawn from the training split, then the
        config's sampler (``steps`` overrides its steps); seeded by ``seed``. ``model`` is put in eval mode."""
        from eqvit.diffusion import GaussianSource

        counts = self.counts.sample(num, np.random.default_rng(seed))
        sampler = make_sampler(self.diffusion_cfg, steps)
        source = GaussianSource(torch.Generator().manual_seed(seed))
        dtype = next(model.parameters()).dtype
        return sampler.sample(model.eval(), counts, source, self.diffusion_cfg.sample_batch, dtype, progress)

    def summary_extras(self, final: dict[str, Any]) -> dict[str, Any]:
        return {
            "val_loss": final["val_loss"],
            "val_molecules": len(self.splits["val"]),
            "train_molecules": len(self.splits["train"]),
        }

    def write_plots(self, final: dict[str, Any], out: Path, name: str) -> list[str]:
        return []
