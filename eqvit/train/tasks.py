"""Tasks: what the engine trains on, how it scores, and what it plots.

A task owns the data for one model's domain. The engine uses:

* ``train_batch() -> (inputs, target)``: ``inputs`` is one tensor or a tuple of tensors, the
  model is called as ``model(*inputs)`` (e.g. ``model(pos, feat)`` for point clouds);
* ``loss(pred, target)``; ``evaluate(model)`` -> metrics (``evaluate(None)`` scores the task's
  baseline, called ``baseline_name``: persistence, the majority class);
* ``monitor`` / ``monitor_mode``: the validation metric the plateau schedule follows, and
  ``curve_label`` / ``loss_label`` for the curve plot;
* ``steps_per_epoch`` (``None`` for an endless stream), ``data_state()`` / ``load_data_state()``
  (what resuming must restore of the data stream);
* ``summary(final, baseline)``, ``table(rows)``, ``verdict(summary)`` and ``write_plots(final, out,
  name)`` for the reports (the first three from :class:`~eqvit.train.reporting.MetricReport`).

:class:`Task` is that list as a typed protocol, the union of one protocol per concern: :class:`TaskData`,
:class:`Objective`, :class:`Evaluation` and :class:`Report`. In-memory tensors are a task too
(:class:`TensorClassificationTask`, what :func:`eqvit.train.classify.fit_classifier` trains on).

The dataset name (``data.name``) decides the task: ``shallow_water`` (SO3ViT on icosphere
vertices, the S2Transformer baseline on the lat-lon grid, the same dynamics), or one of the
classification datasets in :data:`CLASSIFICATION_DATASETS` (add one with
:func:`register_classification_dataset`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from eqvit.train.config import DataConfig
from eqvit.train.reporting import Column, MetricReport
from eqvit.utils import unknown_name_error

Inputs = torch.Tensor | tuple[torch.Tensor, ...]


@runtime_checkable
class TaskData(Protocol):
    """The data: batches ``(inputs, target)`` (the model is called as ``model(*inputs)``), the epoch length
    (None: an endless stream) and the stream's state, which resuming restores."""

    steps_per_epoch: int | None

    def train_batch(self) -> tuple[Inputs, torch.Tensor]: ...

    def data_state(self) -> torch.Tensor: ...

    def load_data_state(self, state: torch.Tensor) -> None: ...


@runtime_checkable
class Objective(Protocol):
    """The training loss, and how its curve is labelled and scaled."""

    loss_label: str
    loss_log_scale: bool

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Evaluation(Protocol):
    """Validation metrics of a model, or (``None``) of the task's baseline ``baseline_name``; ``monitor`` is the
    metric early stopping and the plateau schedule follow, better ``"min"`` or ``"max"`` (``monitor_mode``)."""

    baseline_name: str
    monitor: str
    monitor_mode: str  # "min" | "max"
    curve_label: str

    def evaluate(self, model: nn.Module | None) -> dict[str, Any]: ...


@runtime_checkable
class Report(Protocol):
    """The run's summary entry, final table, verdict and plots (:class:`~eqvit.train.reporting.MetricReport`
    implements the first three for every task)."""

    def summary(self, final: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]: ...

    def table(self, rows: list[tuple[str, dict[str, Any]]]) -> str: ...

    def verdict(self, summary: dict[str, Any]) -> str: ...

    def write_plots(self, final: dict[str, Any], out: Path, name: str) -> list[str]: ...


@runtime_checkable
class Task(TaskData, Objective, Evaluation, Report, Protocol):
    """What the :class:`~eqvit.train.engine.Trainer` needs of a task: its data, objective, evaluation and
    report (the module docstring)."""


def _model_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    return cfg.get("architecture") or type(model).__name__


def domain_kind(domain: Any) -> str:
    """The kind of a model's domain: sphere (unit vectors [P, 3]), plane ([P, 2]), point clouds, none or other."""
    if domain is None:
        return "none"
    points = getattr(domain, "points", None)
    if points is None:
        return "point clouds" if hasattr(domain, "dim") else "other"
    points = np.asarray(points)
    if points.ndim == 2 and points.shape[1] == 3 and np.allclose(np.linalg.norm(points, axis=1), 1.0, atol=1e-6):
        return "sphere"
    if points.ndim == 2 and points.shape[1] == 2:
        return "plane"
    return "other"


def check_domain(dataset: str, needs: str, kinds: tuple[str, ...], model: nn.Module) -> None:
    """ValueError in one sentence when ``model``'s domain is not one of ``kinds`` (what ``dataset`` needs)."""
    domain = getattr(model, "domain", None)
    if domain_kind(domain) in kinds:
        return
    if domain is None:
        takes = "declares no input domain (no .domain)"
    else:
        describe = getattr(domain, "describe_input", None)
        takes = f"takes {describe(getattr(model, 'in_chans', 'C'))}" if describe else f"is on {domain.name}"
    raise ValueError(
        f"model {_model_name(model)!r} does not fit data.name {dataset!r}: the task needs {needs}, "
        f"but the model {takes}"
    )


def check_channels(dataset: str, model: nn.Module, channels: int, what: str) -> None:
    """ValueError in one sentence when ``model`` takes or predicts another number of channels than the
    ``channels`` of ``what`` (found now, not as a tensor-size error at the first step)."""
    for kind, key in (("input", "in_chans"), ("output", "out_chans")):
        got = getattr(model, key, None)
        if got is not None and got != channels:
            raise ValueError(
                f"model {_model_name(model)!r} has {got} {kind} channels, but data.name {dataset!r} has {channels} "
                f"({what}); set model.kwargs.{key}: {channels}"
            )


SPHERE_MODELS = (
    "a model on the sphere (icosphere vertices or a lat-lon grid: so3vit_*, platonic_sphere_*, s2transformer_*)"
)
IMAGE_MODELS = "a model on a square or hexagonal image grid (o2vit_*, platonic_image_*)"
POINT_MODELS = "a point-cloud model called as model(pos, feat) (platonic_points_*)"


ERROR_METRICS = ("rel_l1", "rel_l2", "l1", "l2")


def sample_errors(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{"rel_l1", "rel_l2", "l1", "l2"}`` of ``pred`` against ``target`` (``[B, C, ...]``), each ``[B, C]``."""
    from eqvit.train.metrics import lp_error, relative_lp_error

    return {
        "rel_l1": relative_lp_error(pred, target, weights, p=1, reduction="none"),
        "rel_l2": relative_lp_error(pred, target, weights, p=2, reduction="none"),
        "l1": lp_error(pred, target, weights, p=1, reduction="none"),
        "l2": lp_error(pred, target, weights, p=2, reduction="none"),
    }


def default_cache_dir(cfg: DataConfig) -> Path:
    """Where fixed validation sets are cached: ``data.cache_dir``, ``$EQVIT_CACHE`` or ~/.cache/eqvit."""
    return Path(cfg.cache_dir or os.environ.get("EQVIT_CACHE", "~/.cache/eqvit")).expanduser() / cfg.name


class ShallowWaterTask(MetricReport):
    """Next-hour prediction of the shallow-water state (normalised fields, 3 channels).

    Args:
        cfg: the data section of the experiment config.
        model: the model to train; its ``domain`` decides points (``[V]``) or grid (``[nlat, nlon]``).
        device: where batches go.
    """

    baseline_name = "persistence"
    monitor, monitor_mode = "rel_l2", "min"
    loss_label, loss_log_scale = "train loss (weighted MSE)", True
    curve_label = "validation relative L2"
    steps_per_epoch = None  # an endless stream of fresh simulations
    headline_label = "relative L2"
    report_columns = (
        Column("rel_l2", "rel L2"),
        Column("rel_l1", "rel L1"),
        Column("l2", "L2"),
        Column("l1", "L1"),
        Column("polar_error_ratio", "polar ratio", ".3f"),
    )

    def __init__(self, cfg: DataConfig, model: nn.Module, device: torch.device) -> None:
        from eqvit.data.shallow_water import CHANNELS, ShallowWaterConfig, ShallowWaterData
        from eqvit.train.metrics import latlon_quadrature_weights

        self.cfg, self.device = cfg, device
        check_domain(cfg.name, SPHERE_MODELS, ("sphere",), model)
        check_channels(cfg.name, model, len(CHANNELS), "the shallow-water fields " + ", ".join(CHANNELS))
        domain = model.domain
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
        self.data.check_fits(cfg.batch_size, f"a training batch of data.batch_size {cfg.batch_size:,}")
        self.data.check_fits(cfg.num_val, f"a validation set of data.num_val {cfg.num_val:,}")
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
        self.validation = self.data.validation_set(
            cfg.num_val, seed=cfg.seed + 10_000, cache_dir=default_cache_dir(cfg)
        )

    def train_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.data.next_batch(self.cfg.batch_size, self.kind)
        return x.to(self.device), y.to(self.device)

    def train_rollout_batch(self, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x [B, 3, ...], targets [K, B, 3, ...])``: the next K states of each initial state
        (multi-step training, :mod:`eqvit.train.multistep`); K = 1 draws what :meth:`train_batch` draws."""
        x, targets = self.data.next_rollout_batch(self.cfg.batch_size, num_steps, self.kind)
        return x.to(self.device), targets.to(self.device)

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Quadrature-weighted mean squared error over the sphere, channels and batch."""
        err = (pred - target).pow(2).mean(dim=(0, 1))
        return (err * self._loss_weights).sum()

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None) -> dict[str, Any]:
        """Errors on the validation set (quadrature weighted, per channel and mean over channels and
        samples), error map, polar ratio.

        ``rel_l1`` / ``rel_l2``: relative errors; ``l1`` / ``l2``: the spherical mean absolute error and
        root-mean-square error of the normalised fields, the seed's l1 / l2 (torch-harmonics'
        ``L1LossS2`` / ``L2LossS2``; :mod:`eqvit.train.metrics` says how they relate). ``model=None``
        scores persistence (predict the input).
        """
        from eqvit.train.metrics import SphereErrorMap, polar_error_ratio

        was_training = model.training if model is not None else False
        if model is not None:
            model.eval()
        sums = dict.fromkeys(ERROR_METRICS, 0.0)
        per_channel = dict.fromkeys(ERROR_METRICS, 0.0)
        error_map = SphereErrorMap(kind="abs")
        count = 0
        for x, y in self.validation.batches(self.cfg.val_batch_size, self.kind):
            x, y = x.to(self.device), y.to(self.device)
            pred = x if model is None else model(x)
            pred, y = pred.double().cpu(), y.double().cpu()
            for key, err in sample_errors(pred, y, self.weights).items():  # [B, C]
                sums[key] += err.mean(dim=1).sum().item()
                per_channel[key] = per_channel[key] + err.sum(dim=0)
            error_map.update(pred, y)
            count += len(x)
        if model is not None and was_training:
            model.train()
        emap = error_map.compute()
        where = self.latitudes if self.on_grid else self.points
        return {
            **{key: sums[key] / count for key in ERROR_METRICS},
            **{f"{key}_per_channel": (per_channel[key] / count).tolist() for key in ERROR_METRICS},
            "polar_error_ratio": float(polar_error_ratio(emap, where, self.weights)),
            "error_map": emap,
        }

    def data_state(self) -> torch.Tensor:
        return self.data.generator.get_state()

    def load_data_state(self, state: torch.Tensor) -> None:
        self.data.generator.set_state(state)

    def write_plots(self, final: dict[str, Any], out: Path, name: str) -> list[str]:
        self.plot_error_map(final["error_map"], out / "error_map.png", f"{name}: mean |error| over validation")
        return ["error_map.png"]

    def plot_error_map(self, error_map: torch.Tensor, path: Path, title: str) -> None:
        """Mean absolute error over the validation set: filled icosphere triangles (or grid cells), Mollweide."""
        from eqvit.train.metrics import plot_sphere_maps

        where = {"latitudes": np.asarray(self.latitudes)} if self.on_grid else {"points": self.points.numpy()}
        plot_sphere_maps([dict(title=title, values=error_map.numpy(), **where)], path, cols=1)


# ---------------------------------------------------------------------------------- classification


@dataclass
class ClassificationData:
    """What a classification dataset builder returns.

    ``train`` and ``val`` are map-style datasets whose items are ``(inputs, label)``: ``inputs`` is
    a tensor or a tuple of tensors (the model is called as ``model(*inputs)``). A dataset with a
    ``batch(indices) -> (inputs tuple, labels)`` method (:class:`TensorSplit`) is batched by
    indexing; others item by item.
    """

    train: Any
    val: Any
    classes: list[str]


class TensorSplit(torch.utils.data.Dataset):
    """An in-memory split: ``inputs`` (a tensor or tuple of ``[N, ...]`` tensors) and ``labels [N]``."""

    def __init__(self, inputs: torch.Tensor | tuple[torch.Tensor, ...], labels: torch.Tensor) -> None:
        self.inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        bad = [list(t.shape) for t in self.inputs if len(t) != len(self.labels)]
        if bad:
            raise ValueError(f"expected inputs with {len(self.labels)} rows (one per label), got shapes {bad}")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, ...], int]:
        return tuple(t[index] for t in self.inputs), int(self.labels[index])

    def batch(self, index: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return tuple(t[index] for t in self.inputs), self.labels[index]


def _gather(dataset: Any, index: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    if hasattr(dataset, "batch"):
        return dataset.batch(index)
    items = [dataset[int(i)] for i in index]
    first = items[0][0]
    if torch.is_tensor(first):
        inputs = (torch.stack([x for x, _ in items]),)
    else:
        inputs = tuple(torch.stack([x[k] for x, _ in items]) for k in range(len(first)))
    return inputs, torch.as_tensor([int(y) for _, y in items], dtype=torch.long)


def _labels(dataset: Any) -> torch.Tensor:
    """Every label of ``dataset`` (without loading inputs where the dataset keeps them)."""
    if hasattr(dataset, "labels"):
        return torch.as_tensor(dataset.labels, dtype=torch.long)
    if hasattr(dataset, "items"):
        return torch.as_tensor([int(y) for _, y in dataset.items], dtype=torch.long)
    return torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))], dtype=torch.long)


ClassificationBuilder = Callable[[DataConfig, nn.Module], ClassificationData]
CLASSIFICATION_DATASETS: dict[str, ClassificationBuilder] = {}


def register_classification_dataset(*names: str) -> Callable[[ClassificationBuilder], ClassificationBuilder]:
    """Register ``builder(cfg: DataConfig, model) -> ClassificationData`` under ``names`` (``data.name``)."""

    def wrap(builder: ClassificationBuilder) -> ClassificationBuilder:
        for name in names:
            CLASSIFICATION_DATASETS[name] = builder
        return builder

    return wrap


def _image_input(cfg: DataConfig, model: nn.Module, default_size: int) -> tuple[int, nn.Module | None]:
    """``(side, transform)``: the square image side to load at, and the map to the model's domain.

    Square-grid models (``domain.shape == (H, W)``) take ``H x W`` images; hexagonal models
    (``[P, 2]`` points) take ``data.img_size`` (default ``default_size``) images resampled by
    :class:`~eqvit.nn.tokenizers.hexagonal.SquareToHex`.
    """
    from eqvit.nn.tokenizers.hexagonal import SquareToHex

    check_domain(cfg.name, IMAGE_MODELS, ("plane",), model)
    domain = model.domain
    shape = tuple(domain.shape)
    if len(shape) == 2:
        if shape[0] != shape[1]:
            raise ValueError(f"expected a model on a square grid, got {domain.name} of shape {list(shape)}")
        if cfg.img_size is not None and cfg.img_size != shape[0]:
            raise ValueError(
                f"data.img_size {cfg.img_size} does not match the model's {shape[0]}x{shape[1]} grid "
                f"(set model.kwargs.img_size: {cfg.img_size}, or drop data.img_size)"
            )
        return shape[0], None
    points = np.asarray(domain.points)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"expected a model on a planar grid for images, got {domain.name}")
    size = cfg.img_size or default_size
    return size, SquareToHex(size, points)


@functools.lru_cache(maxsize=4)
def _rotated_mnist(sample_ratio: float, seed: int, img_size: int, split_seed: int) -> dict:
    """:func:`eqvit.data.images.rotated_mnist`, kept for the next run in this process (resume, eval)."""
    from eqvit.data.images import rotated_mnist

    return rotated_mnist(sample_ratio, seed=seed, img_size=img_size, split_seed=split_seed)


@register_classification_dataset("rotated_mnist")
def rotated_mnist_data(cfg: DataConfig, model: nn.Module) -> ClassificationData:
    """Rotated MNIST (:func:`eqvit.data.images.rotated_mnist`): ``data.sample_ratio`` of 4,000 training digits.

    ``data.seed`` seeds the rotation angles, ``data.split_seed`` the 4,000 / 1,000 split; digits are
    padded to the model's square grid (>= 28) or to ``data.img_size`` (default 32) then resampled
    onto a hexagonal model's grid.
    """
    size, transform = _image_input(cfg, model, default_size=32)
    data = _rotated_mnist(cfg.sample_ratio, cfg.seed, size, cfg.split_seed)
    splits = {}
    for key, (x, y) in data.items():
        if transform is not None:
            with torch.no_grad():
                x = transform(x)
        splits[key] = TensorSplit(x, y)
    return ClassificationData(splits["train"], splits["val"], [str(d) for d in range(10)])


@register_classification_dataset("synthetic_pointclouds")
def pointcloud_data(cfg: DataConfig, model: nn.Module) -> ClassificationData:
    """Synthetic 3-D shapes (:func:`eqvit.data.pointclouds.pointcloud_splits`) for ``model(pos, feat)``.

    ``data.num_train`` clouds (``data.sample_ratio`` of them used) rotated by ``data.train_rotate``,
    ``data.num_val`` validation clouds rotated by ``data.val_rotate`` (default: random SO(3), the
    test of rotation invariance), ``data.num_points`` points each, split seeded by ``data.split_seed``.
    """
    from eqvit.data.pointclouds import pointcloud_splits

    check_domain(cfg.name, POINT_MODELS, ("point clouds",), model)
    splits = pointcloud_splits(
        cfg.num_train,
        cfg.num_val,
        0,
        num_points=cfg.num_points,
        train_rotate=cfg.train_rotate,
        test_rotate=cfg.val_rotate,
        seed=cfg.split_seed,
    )
    keep = max(1, round(cfg.sample_ratio * cfg.num_train))
    train, val = splits.train, splits.test
    return ClassificationData(
        TensorSplit((train.pos[:keep], train.feat[:keep]), train.labels[:keep]),
        TensorSplit((val.pos, val.feat), val.labels),
        list(splits.classes),
    )


@register_classification_dataset("image_folder", "patternnet")
def image_folder_data(cfg: DataConfig, model: nn.Module) -> ClassificationData:
    """Images in ``data.root`` (one sub-folder per class, e.g. PatternNet's ``images/``), RGB in [-1, 1].

    A seeded ``1 - val_fraction`` / ``val_fraction`` split within each class
    (:func:`eqvit.data.images.image_folder_split`), of whose training part ``data.sample_ratio`` is
    used (a seeded subset); images are resized to the model's square grid or to ``data.img_size``
    (default 256) and resampled onto a hexagonal model's grid. Loaded lazily, image by image.
    """
    from eqvit.data.images import IMAGE_SUFFIXES, ImageFolderDataset, image_folder_split

    if cfg.root is None:
        raise ValueError(
            f"data.root is required for data.name {cfg.name!r}: the folder with one sub-folder of images per class"
        )
    root = Path(cfg.root).expanduser()
    if not root.is_dir():
        raise ValueError(
            f"data.root {cfg.root!r} is not an existing folder "
            f"(data.name {cfg.name!r} expects one sub-folder of images per class)"
        )
    if not 0 < cfg.sample_ratio <= 1:
        raise ValueError(f"expected 0 < data.sample_ratio <= 1, got {cfg.sample_ratio}")
    train, val, classes = image_folder_split(root, cfg.val_fraction, seed=cfg.split_seed)
    if not train:
        raise ValueError(f"data.root {cfg.root!r}: no images ({', '.join(IMAGE_SUFFIXES)}) in the class folders")
    if cfg.sample_ratio < 1:
        order = np.random.default_rng(cfg.split_seed).permutation(len(train))
        train = [train[i] for i in sorted(order[: max(1, round(cfg.sample_ratio * len(train)))])]
    size, transform = _image_input(cfg, model, default_size=256)
    return ClassificationData(
        ImageFolderDataset(train, size, transform), ImageFolderDataset(val, size, transform), classes
    )


def _require_root(cfg: DataConfig, what: str) -> Path:
    if cfg.root is None:
        raise ValueError(f"data.root is required for data.name {cfg.name!r}: {what}")
    return Path(cfg.root).expanduser()


def _subset(n: int, cfg: DataConfig) -> torch.Tensor:
    """The seeded ``data.sample_ratio`` part of ``n`` training samples (all of them at 1), sorted."""
    if cfg.sample_ratio >= 1:
        return torch.arange(n)
    order = np.random.default_rng(cfg.split_seed).permutation(n)[: max(1, round(cfg.sample_ratio * n))]
    return torch.from_numpy(np.sort(order))


@register_classification_dataset("scanobjectnn")
def scanobjectnn_data(cfg: DataConfig, model: nn.Module) -> ClassificationData:
    """ScanObjectNN's h5 files in ``data.root`` (:mod:`eqvit.data.scanobjectnn`, variant PB_T50_RS): the
    first ``data.num_points`` points of each cloud, features all ones; validation is the test file
    (the dataset has no validation split); ``data.sample_ratio`` of the training clouds."""
    from eqvit.data.scanobjectnn import CLASSES, scanobjectnn_splits

    check_domain(cfg.name, POINT_MODELS, ("point clouds",), model)
    root = _require_root(cfg, "the folder with the ScanObjectNN h5 files (or its main_split/)")
    splits = {}
    for key, (points, labels) in scanobjectnn_splits(root, num_points=cfg.num_points).items():
        pos = torch.from_numpy(points)
        splits[key] = (pos, torch.ones(*pos.shape[:2], 1), torch.from_numpy(labels))
    pos, feat, labels = splits["train"]
    keep = _subset(len(labels), cfg)
    pos_t, feat_t, labels_t = splits["test"]
    return ClassificationData(
        TensorSplit((pos[keep], feat[keep]), labels[keep]), TensorSplit((pos_t, feat_t), labels_t), list(CLASSES)
    )


@register_classification_dataset("cifar10")
def cifar10_data(cfg: DataConfig, model: nn.Module) -> ClassificationData:
    """CIFAR-10's binary batches in ``data.root`` (:mod:`eqvit.data.cifar10`; the pickled python version is
    refused), RGB in [-1, 1], resized to the model's grid (or resampled onto a hexagonal one);
    validation is ``test_batch.bin``; ``data.sample_ratio`` of the training images."""
    from eqvit.data.cifar10 import cifar10_binary, classes

    size, transform = _image_input(cfg, model, default_size=32)
    root = _require_root(cfg, "the folder with the CIFAR-10 binary batches (cifar-10-batches-bin)")
    data = cifar10_binary(root)
    splits = {}
    for key, (images, labels) in data.items():
        x = torch.from_numpy(images).float().div_(127.5).sub_(1.0)
        if key == "train":
            keep = _subset(len(labels), cfg)
            x, labels = x[keep], labels[keep.numpy()]
        if size != 32:
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        if transform is not None:
            with torch.no_grad():
                x = transform(x)
        splits[key] = TensorSplit(x, torch.from_numpy(labels))
    return ClassificationData(splits["train"], splits["test"], classes(root))


class ClassificationTask(MetricReport):
    """Classification of a registered dataset (``data.name``) with cross-entropy.

    Batches follow a seeded permutation per epoch (``data.seed``, the epoch), so the data stream is a
    function of the step and resuming restores it exactly. Scores: accuracy, validation
    cross-entropy, per-class accuracy and the confusion matrix; the baseline predicts the majority
    class of the training set (its cross-entropy is that of the training class frequencies).
    """

    baseline_name = "majority_class"
    monitor, monitor_mode = "accuracy", "max"
    loss_label, loss_log_scale = "train loss (cross-entropy)", False
    curve_label = "validation accuracy"
    headline_label = "accuracy"
    report_columns = (Column("accuracy", "accuracy", ".2f", 100.0, "%"), Column("val_loss", "val loss"))

    def __init__(self, cfg: DataConfig, model: nn.Module, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        data = CLASSIFICATION_DATASETS[cfg.name](cfg, model)
        self.train_set, self.val_set, self.classes = data.train, data.val, list(data.classes)
        if len(self.train_set) == 0 or len(self.val_set) == 0:
            raise ValueError(
                f"dataset {cfg.name!r} has {len(self.train_set)} training and {len(self.val_set)} validation samples"
            )
        outputs = getattr(model, "out_chans", None)
        if outputs is not None and outputs != len(self.classes):
            raise ValueError(
                f"model {type(model).__name__} has {outputs} outputs but dataset {cfg.name!r} has "
                f"{len(self.classes)} classes; set model.kwargs.num_classes: {len(self.classes)}"
            )
        self.steps_per_epoch = math.ceil(len(self.train_set) / cfg.batch_size)
        self.position = 0  # batches drawn so far
        self._order: tuple[int, torch.Tensor] | None = None
        counts = torch.bincount(_labels(self.train_set), minlength=len(self.classes)).double()
        self.prior = counts / counts.sum()

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if self._order is None or self._order[0] != epoch:
            gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(len(self.train_set), generator=gen))
        return self._order[1]

    def train_batch(self) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        epoch, b = divmod(self.position, self.steps_per_epoch)
        bs = self.cfg.batch_size
        index = self._epoch_order(epoch)[b * bs : (b + 1) * bs]
        self.position += 1
        inputs, labels = _gather(self.train_set, index)
        return tuple(t.to(self.device) for t in inputs), labels.to(self.device)

    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(pred, target)

    def data_state(self) -> torch.Tensor:
        return torch.tensor([self.position], dtype=torch.int64)

    def load_data_state(self, state: torch.Tensor) -> None:
        self.position = int(state.reshape(-1)[0])

    @torch.no_grad()
    def evaluate(self, model: nn.Module | None) -> dict[str, Any]:
        """Accuracy, mean cross-entropy, per-class accuracy, confusion matrix (rows: true class).

        ``model=None`` scores the baseline: the majority class with the training class frequencies.
        """
        from eqvit.train.metrics import classification_scores

        was_training = model.training if model is not None else False
        if model is not None:
            model.eval()
        logits_all, labels_all = [], []
        n = len(self.val_set)
        for start in range(0, n, self.cfg.val_batch_size):
            index = torch.arange(start, min(start + self.cfg.val_batch_size, n))
            inputs, labels = _gather(self.val_set, index)
            if model is None:
                logits = self.prior.clamp_min(1e-12).log().expand(len(labels), -1)
            else:
                logits = model(*(t.to(self.device) for t in inputs)).float().cpu()
            logits_all.append(logits.double())
            labels_all.append(labels)
        if model is not None and was_training:
            model.train()
        return classification_scores(torch.cat(logits_all), torch.cat(labels_all), len(self.classes))

    def write_plots(self, final: dict[str, Any], out: Path, name: str) -> list[str]:
        from eqvit.train.metrics import plot_confusion

        plot_confusion(
            final["confusion"], self.classes, out / "confusion.png", f"{name}: accuracy {100 * final['accuracy']:.2f}%"
        )
        return ["confusion.png"]


class TensorClassificationTask(ClassificationTask):
    """Classification of in-memory tensors: ``train = (inputs, labels)``, ``val = (inputs, labels)``.

    ``inputs`` is a tensor or a tuple of tensors (the model is called as ``model(*inputs)``). Each
    epoch visits the training set in the order of one ``torch.randperm`` drawn from a generator
    seeded once with ``seed`` (epoch after epoch from the same generator), in batches of
    ``batch_size``; the scores are :class:`ClassificationTask`'s.

    Args:
        num_classes: the number of logits (default: the model's ``out_chans`` or ``num_classes``, else
            the width of its output on one validation sample; without a model, the largest label + 1).
        shuffle: ``False`` visits the training set in its own order every epoch (full-batch fits).
    """

    def __init__(
        self,
        train: tuple[Inputs, torch.Tensor],
        val: tuple[Inputs, torch.Tensor],
        *,
        batch_size: int = 64,
        seed: int = 0,
        device: torch.device | str = "cpu",
        val_batch_size: int = 256,
        num_classes: int | None = None,
        model: nn.Module | None = None,
        shuffle: bool = True,
    ) -> None:
        self.shuffle = shuffle
        self.cfg = DataConfig(name="tensors", batch_size=batch_size, val_batch_size=val_batch_size, seed=seed)
        self.device = torch.device(device)
        self.train_set, self.val_set = TensorSplit(*train), TensorSplit(*val)
        if len(self.train_set) == 0 or len(self.val_set) == 0:
            raise ValueError(
                f"expected non-empty splits, got {len(self.train_set)} training and {len(self.val_set)} "
                "validation samples"
            )
        if num_classes is None and model is not None:
            num_classes = getattr(model, "out_chans", None) or getattr(model, "num_classes", None)
        if num_classes is None and model is not None:
            num_classes = self._output_width(model)
        if num_classes is None:
            num_classes = int(max(self.train_set.labels.max(), self.val_set.labels.max())) + 1
        self._set_classes(num_classes)
        self.steps_per_epoch = math.ceil(len(self.train_set) / batch_size)
        self.position = 0
        self._order: tuple[int, torch.Tensor] | None = None
        self._generator = torch.Generator().manual_seed(seed)

    def _set_classes(self, num_classes: int) -> None:
        self.classes = [str(k) for k in range(num_classes)]
        counts = torch.bincount(self.train_set.labels, minlength=num_classes).double()
        self.prior = counts / counts.sum()

    @torch.no_grad()
    def _output_width(self, model: nn.Module) -> int:
        was_training = model.training
        inputs, _ = _gather(self.val_set, torch.arange(1))
        width = model.eval()(*(t.to(self.device) for t in inputs)).shape[-1]
        model.train(was_training)
        return int(width)

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(len(self.train_set))
        if self._order is None or self._order[0] > epoch:  # from the start (a resumed stream)
            self._generator.manual_seed(self.cfg.seed)
            self._order = (-1, torch.empty(0, dtype=torch.long))
        while self._order[0] < epoch:
            self._order = (self._order[0] + 1, torch.randperm(len(self.train_set), generator=self._generator))
        return self._order[1]


def _qm9_task(cfg: DataConfig, model: nn.Module, device: torch.device):
    """QM9 property regression (:class:`eqvit.train.regression.QM9Task`, loaded on first use)."""
    from eqvit.train.regression import QM9Task

    return QM9Task(cfg, model, device)


def _qm9_generation_task(cfg: DataConfig, model: nn.Module, device: torch.device):
    """QM9 molecule generation (:class:`eqvit.train.generation.QM9GenerationTask`, loaded on first use)."""
    from eqvit.train.generation import QM9GenerationTask

    return QM9GenerationTask(cfg, model, device)


TASKS = {"shallow_water": ShallowWaterTask, "qm9": _qm9_task, "qm9_generation": _qm9_generation_task}


def dataset_names() -> list[str]:
    """Every valid ``data.name``."""
    return [*TASKS, *CLASSIFICATION_DATASETS]


def check_dataset_name(name: str) -> None:
    """ValueError listing the valid ``data.name`` values (with a close match) unless ``name`` is one."""
    if name not in dataset_names():
        raise unknown_name_error("dataset (data.name)", name, dataset_names())


def build_task(cfg: DataConfig, model: nn.Module, device: torch.device):
    """The task for ``cfg.name``: shallow water, or classification of a registered dataset.

    A model whose domain does not fit the task (an image model on shallow water) is a ValueError
    saying what the task needs and what the model takes.
    """
    if cfg.name in TASKS:
        return TASKS[cfg.name](cfg, model, device)
    if cfg.name in CLASSIFICATION_DATASETS:
        return ClassificationTask(cfg, model, device)
    raise unknown_name_error("dataset (data.name)", cfg.name, dataset_names())
