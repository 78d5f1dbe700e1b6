"""QM9 property regression as a :class:`~eqvit.train.tasks.Task` (``data.name: qm9``).

Targets by name (``data.targets``, any of :data:`eqvit.data.qm9.TARGET_NAMES`): ``mu alpha homo lumo
gap r2 zpve u0 u h g cv``. Each is normalised on the training set: the extensive ones with an atom
reference (``u0 u h g zpve cv``, the properties QM9's own ``atomref`` table covers) first lose a
least-squares fit on the element counts (H, C, N, O, F and a constant), then every target is
centred and divided by its standard deviation. Training minimises the L1 loss on the normalised
targets, averaged over targets; scores are MAEs in each field's usual unit (meV for energies,
1 Ha = 27,211.386 meV; D; bohr^3; bohr^2; cal/(mol K)). The baseline predicts the normalisation
itself (the training mean, or the element-count fit).

Batches hold molecules of one atom count (buckets of the training set, shuffled per epoch with
``data.seed`` and the epoch), so the model needs no attention mask; the data stream is a function
of the step, and resuming restores it. ``data.split_seed`` fixes the Cormorant / EGNN split
(:func:`eqvit.data.qm9.qm9_splits`); ``data.sample_ratio`` uses a seeded part of the 100,000
training molecules; ``data.eval_subset`` scores the first N of the validation split (all by
default; the test split is always scored whole); ``data.root`` reads the original ``.xyz`` files instead of qm9pack.

At the end, the engine calls :meth:`QM9Task.evaluate_test`, and ``metrics.json`` holds
``val_mae`` and ``test_mae``, per target, in those units.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from eqvit.train.config import DataConfig
from eqvit.train.reporting import Column, MetricReport

HARTREE_MEV = 27_211.386
UNITS = {
    "mu": ("D", 1.0),
    "alpha": ("bohr^3", 1.0),
    "homo": ("meV", HARTREE_MEV),
    "lumo": ("meV", HARTREE_MEV),
    "gap": ("meV", HARTREE_MEV),
    "r2": ("bohr^2", 1.0),
    "zpve": ("meV", HARTREE_MEV),
    "u0": ("meV", HARTREE_MEV),
    "u": ("meV", HARTREE_MEV),
    "h": ("meV", HARTREE_MEV),
    "g": ("meV", HARTREE_MEV),
    "cv": ("cal/(mol K)", 1.0),
}
EXTENSIVE = ("u0", "u", "h", "g", "zpve", "cv")
# EGNN (Satorras et al. 2021, Table 3), full training budget: context, not comparable in budget.
PUBLISHED_EGNN = {"gap": 48.0, "homo": 29.0, "lumo": 25.0, "mu": 0.029}


class QM9NotInstalledError(ValueError, ModuleNotFoundError):
    """qm9pack is missing (a ValueError too, so the CLI reports it in one paragraph with exit code 2)."""


def element_counts(split: Any) -> np.ndarray:
    """``[M, 5]`` counts of H, C, N, O, F per molecule of a :class:`~eqvit.data.qm9.QM9Dataset`."""
    from eqvit.data.qm9 import element_index

    arrays = split.arrays
    per_atom = element_index(arrays.atoms)
    mol = np.repeat(np.arange(len(arrays)), arrays.num_atoms)
    counts = np.zeros((len(arrays), 5))
    np.add.at(counts, (mol, per_atom), 1)
    return counts[split.ids]


class Normaliser:
    """``z = (t - fit(counts) - mean) / std`` per target, fitted on the training set (see the module docstring)."""

    def __init__(self, names: list[str], targets: np.ndarray, counts: np.ndarray) -> None:
        self.names = names
        design = np.concatenate([counts, np.ones((len(counts), 1))], axis=1)
        self.coef = np.zeros((design.shape[1], len(names)))
        for k, name in enumerate(names):
            if name in EXTENSIVE:
                self.coef[:, k] = np.linalg.lstsq(design, targets[:, k], rcond=None)[0]
        resid = targets - design @ self.coef
        self.mean, self.std = resid.mean(0), resid.std(0)
        self.std[self.std == 0] = 1.0

    def reference(self, counts: np.ndarray) -> np.ndarray:
        """The part of the targets the normalisation predicts ``[M, T]`` (native units)."""
        design = np.concatenate([counts, np.ones((len(counts), 1))], axis=1)
        return design @ self.coef + self.mean

    def encode(self, targets: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return (targets - self.reference(counts)) / self.std

    def decode(self, z: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return z * self.std + self.reference(counts)


def same_count_batches(num_atoms: np.ndarray, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    """Rows grouped by atom count, cut into batches of at most ``batch_size``; with ``rng`` the rows of
    each bucket and the order of the batches are shuffled, otherwise both are sorted."""
    batches = []
    for n in np.unique(num_atoms):
        rows = np.flatnonzero(num_atoms == n)
        if rng is not None:
            rows = rng.permutation(rows)
        batches.extend(rows[i : i + batch_size] for i in range(0, len(rows), batch_size))
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


class QM9Task(MetricReport):
    """Regression of QM9 properties with a molecule model ``model(pos [B, n, 3], atoms [B, n, 5])``."""

    baseline_name = "train_mean"
    monitor, monitor_mode = "mae_norm", "min"
    loss_label, loss_log_scale = "train loss (L1, normalised targets)", True
    curve_label = "validation MAE (normalised, mean over targets)"
    headline_label = "validation MAE (normalised, mean over targets)"

    def __init__(self, cfg: DataConfig, model: nn.Module, device: torch.device) -> None:
        from eqvit.data.qm9 import ELEMENTS, qm9_splits, target_columns
        from eqvit.train.tasks import default_cache_dir

        self.cfg, self.device = cfg, torch.device(device)
        self.names = list(cfg.targets)
        if not self.names:
            raise ValueError("data.targets: expected at least one QM9 target, got none")
        self.columns = target_columns(self.names)  # ValueError naming an unknown target
        self.report_columns = tuple(Column(f"mae_{n}", f"MAE {n} [{UNITS[n][0]}]", ".4g") for n in self.names)
        in_chans = getattr(model, "in_chans", None)
        outputs = getattr(model, "out_chans", None)
        if in_chans != len(ELEMENTS) or getattr(getattr(model, "domain", None), "dim", None) != 3:
            raise ValueError(
                f"data.name 'qm9' needs a molecule model called as model(pos [B, N, 3], atoms [B, N, "
                f"{len(ELEMENTS)}]) (platonic_qm9_*), got one with in_chans {in_chans}"
            )
        if outputs != len(self.names):
            raise ValueError(
                f"the model has {outputs} outputs but data.targets has {len(self.names)} ({', '.join(self.names)}); "
                f"set model.kwargs.num_targets: {len(self.names)}"
            )
        try:
            splits = qm9_splits(cfg.split_seed, root=cfg.root, cache_dir=default_cache_dir(cfg))
        except ModuleNotFoundError as err:
            raise QM9NotInstalledError(str(err)) from None
        train = splits["train"]
        if cfg.sample_ratio < 1:
            keep = max(1, round(cfg.sample_ratio * len(train)))
            ids = np.sort(np.random.default_rng(cfg.split_seed).permutation(len(train))[:keep])
            train = type(train)(train.arrays, train.ids[ids], "train")
        self.splits = {"train": train, "val": splits["val"], "test": splits["test"]}
        if cfg.eval_subset is not None:  # the validation curve only: the test split is always scored whole
            val = self.splits["val"]
            self.splits["val"] = type(val)(val.arrays, val.ids[: cfg.eval_subset], "val")
        self.counts = {k: element_counts(s) for k, s in self.splits.items()}
        self.norm = Normaliser(self.names, train.targets[:, self.columns], self.counts["train"])
        self.z = {k: self.norm.encode(s.targets[:, self.columns], self.counts[k]) for k, s in self.splits.items()}
        self.steps_per_epoch = len(same_count_batches(train.num_atoms, cfg.batch_size, None))
        self.position = 0
        self._order: tuple[int, list[np.ndarray]] | None = None

    # ------------------------------------------------------------------ data
    def _inputs(self, split: str, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        from eqvit.data.qm9 import element_index

        pos, atoms = self.splits[split].same_size_batch(rows)
        onehot = np.eye(5, dtype=np.float32)[element_index(atoms)]
        return (
            torch.from_numpy(pos.astype(np.float32)).to(self.device),
            torch.from_numpy(onehot).to(self.device),
        )

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        if self._order is None or self._order[0] != epoch:
            rng = np.random.default_rng([self.cfg.seed, epoch])
            self._order = (epoch, same_count_batches(self.splits["train"].num_atoms, self.cfg.batch_size, rng))
        return self._order[1]

    def train_batch(self) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        epoch, b = divmod(self.position, self.steps_per_epoch)
        rows = self._epoch_batches(epoch)[b]
        self.position += 1
        target = torch.from_numpy(self.z["train"][rows].astype(np.float32)).to(self.device)
        return self._inputs("train", rows), target

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (pred - target).abs().mean()

    def data_state(self) -> torch.Tensor:
        return torch.tensor([self.position], dtype=torch.int64)

    def load_data_state(self, state: torch.Tensor) -> None:
        self.position = int(state.reshape(-1)[0])

    # ------------------------------------------------------------------ scores
    @torch.no_grad()
    def predict(self, model: nn.Module | None, split: str) -> np.ndarray:
        """Predictions ``[M, T]`` on ``split`` in native units (``None``: the normalisation's reference)."""
        z = np.zeros_like(self.z[split])
        if model is not None:
            was_training = model.training
            model.eval()
            for rows in same_count_batches(self.splits[split].num_atoms, self.cfg.val_batch_size, None):
                z[rows] = model(*self._inputs(split, rows)).double().cpu().numpy()
            model.train(was_training)
        return self.norm.decode(z, self.counts[split])

    def scores(self, model: nn.Module | None, split: str) -> dict[str, Any]:
        """``mae_<target>`` in its unit, ``mae_norm`` (normalised, mean over targets) and the predictions."""
        pred = self.predict(model, split)
        truth = self.splits[split].targets[:, self.columns]
        err = np.abs(pred - truth)
        out: dict[str, Any] = {f"mae_{n}": float(err[:, k].mean() * UNITS[n][1]) for k, n in enumerate(self.names)}
        out["mae_norm"] = float((err / self.norm.std).mean())
        out["predictions"] = torch.from_numpy(pred)  # tensors stay out of the JSON reports (the plot reads them)
        out["truth"] = torch.from_numpy(truth)
        return out

    def evaluate(self, model: nn.Module | None) -> dict[str, Any]:
        return self.scores(model, "val")

    def evaluate_test(self, model: nn.Module) -> dict[str, Any]:
        """``{"test_mae": {target: MAE in its unit}}`` on the test split (the engine calls it at the end)."""
        test = self.scores(model, "test")
        return {"test_mae": {n: test[f"mae_{n}"] for n in self.names}, "test_molecules": len(self.splits["test"])}

    def summary_extras(self, final: dict[str, Any]) -> dict[str, Any]:
        return {
            "val_mae": {n: final[f"mae_{n}"] for n in self.names},
            "units": {n: UNITS[n][0] for n in self.names},
            "val_molecules": len(self.splits["val"]),
            "train_molecules": len(self.splits["train"]),
        }

    def write_plots(self, final: dict[str, Any], out: Path, name: str) -> list[str]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        pred, truth = final["predictions"].numpy(), final["truth"].numpy()
        cols = len(self.names)
        fig, axes = plt.subplots(1, cols, figsize=(4 * cols, 4), squeeze=False)
        for k, (ax, n) in enumerate(zip(axes[0], self.names)):
            unit, scale = UNITS[n]
            ax.scatter(truth[:, k] * scale, pred[:, k] * scale, s=2, alpha=0.4)
            lo, hi = (truth[:, k] * scale).min(), (truth[:, k] * scale).max()
            ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8)
            ax.set_xlabel(f"true {n} [{unit}]")
            ax.set_ylabel(f"predicted {n} [{unit}]")
            ax.set_title(f"{n}: MAE {final[f'mae_{n}']:.4g} {unit}")
        fig.suptitle(f"{name} (validation)")
        fig.tight_layout()
        fig.savefig(out / "parity.png", dpi=110)
        plt.close(fig)
        return ["parity.png"]
