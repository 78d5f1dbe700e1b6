"""Experiment configs: YAML validated against dataclasses.

An unknown key is an error naming the key, where it was found and the closest valid key; a
wrong type names the field. ``load_config(path)`` returns an :class:`ExperimentConfig`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eqvit.utils import unknown_name_error


class ConfigError(ValueError):
    """A user error in a config file (reported without a traceback by the CLI)."""


# The name-valued fields and what they may be (each checked with a close-match suggestion).
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("cosine", "plateau", "constant")
RELAXATION_UNITS = ("step", "epoch")
ROTATIONS = ("none", "z", "so3")
SDPA_BACKENDS = ("flash", "efficient", "math", "cudnn")
DEVICES = ("cpu", "cuda", "cuda:N")


def check_choice(where: str, kind: str, value: Any, valid: tuple[str, ...]) -> None:
    """ConfigError ``unknown <kind> (<where>) 'x'. Did you mean 'y'? Valid: ...`` unless ``value in valid``."""
    if value not in valid:
        raise unknown_name_error(f"{kind} ({where})", value, valid, cls=ConfigError)


def check_range(where: str, value: Any, low: float, *, strict: bool = False, optional: bool = False) -> None:
    """ConfigError unless ``value >= low`` (``> low`` if ``strict``); ``None`` passes when ``optional``."""
    if value is None and optional:
        return
    if value is None or (value <= low if strict else value < low):
        bound = f"> {low}" if strict else f">= {low}"
        extra = " (or null for the default)" if optional else ""
        raise ConfigError(f"{where}: expected a value {bound}{extra}, got {value!r}")


def check_finite(where: str, value: Any) -> None:
    """ConfigError for a NaN or an infinity anywhere in ``value`` (a number, or the numbers in nested mappings and
    lists): validation by ranges lets NaN through, and a run with it trains NaN weights."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if isinstance(value, dict):
        for key, item in value.items():
            check_finite(f"{where}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_finite(f"{where}[{index}]", item)


def check_finite_fields(section: Any, where: str) -> None:
    """:func:`check_finite` on every field of the dataclass ``section`` (named ``where.<field>``)."""
    for item in dataclasses.fields(section):
        value = getattr(section, item.name)
        if not dataclasses.is_dataclass(value):
            check_finite(f"{where}.{item.name}", value)


def check_device(where: str, value: str) -> None:
    """``cpu``, ``cuda`` or ``cuda:N``."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", str(value)):
        raise unknown_name_error(f"device ({where})", value, DEVICES, cls=ConfigError)


@dataclass
class RelaxationConfig:
    """Gradual symmetry breaking: start G-equivariant, restrict to subgroups at scheduled times.

    ``schedule`` maps a time (in ``unit``: ``"step"`` or ``"epoch"``) to a subgroup name, e.g.
    ``{5: D2, 10: C1}``; at the start of that step / epoch the model is replaced by its
    :func:`eqvit.models.restrict.restrict`-ion (same function, more freedom) and the optimiser restarts.
    Only O(2)-subgroup ViTs (``o2vit_*``) can be restricted.
    """

    unit: str = "epoch"
    schedule: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_finite_fields(self, "model.relaxation")
        check_choice("model.relaxation.unit", "unit", self.unit, RELAXATION_UNITS)
        negative = [k for k in self.schedule if k < 0]
        if negative:
            raise ConfigError(f"model.relaxation.schedule: times must be >= 0, got {negative}")


@dataclass
class ModelConfig:
    name: str = "so3vit_tiny"
    kwargs: dict[str, Any] = field(default_factory=dict)
    relaxation: RelaxationConfig = field(default_factory=RelaxationConfig)

    def __post_init__(self) -> None:
        check_finite_fields(self, "model")


@dataclass
class DiffusionConfig:
    """``data.diffusion``: the diffusion of ``data.name: qm9_generation`` (:mod:`eqvit.diffusion`).

    ``schedule``: ``polynomial`` (EDM), ``cosine`` or ``linear`` (flow matching, ADiT); ``target``: what the
    network predicts, ``eps``, ``x0`` or ``v``; ``weighting``: the loss weighting, ``eps``, ``x0`` or ``velocity``;
    ``type_scale``: the one-hot atom types' scale. ``sampler`` (``ancestral`` or ``ddim``) runs ``steps`` steps in
    batches of ``sample_batch`` molecules; each evaluation samples ``eval_samples`` molecules (0: none) with
    ``eval_steps`` steps (null: ``steps``) and reports their atom and molecule stability.
    """

    schedule: str = "cosine"
    target: str = "v"
    weighting: str = "velocity"
    type_scale: float = 0.25
    sampler: str = "ancestral"
    steps: int = 250
    sample_batch: int = 100
    eval_samples: int = 0
    eval_steps: int | None = None

    def __post_init__(self) -> None:
        from eqvit.diffusion import SAMPLERS, SCHEDULES, TARGETS, WEIGHTINGS

        check_finite_fields(self, "data.diffusion")
        check_choice("data.diffusion.schedule", "noise schedule", self.schedule, SCHEDULES)
        check_choice("data.diffusion.target", "target", self.target, TARGETS)
        check_choice("data.diffusion.weighting", "loss weighting", self.weighting, WEIGHTINGS)
        check_choice("data.diffusion.sampler", "sampler", self.sampler, SAMPLERS)
        check_range("data.diffusion.type_scale", self.type_scale, 0, strict=True)
        for key in ("steps", "sample_batch"):
            check_range(f"data.diffusion.{key}", getattr(self, key), 1)
        check_range("data.diffusion.eval_samples", self.eval_samples, 0)
        check_range("data.diffusion.eval_steps", self.eval_steps, 1, optional=True)


@dataclass
class DataConfig:
    """The dataset (``name``) and how it is batched; the task follows from the name.

    ``shallow_water`` uses ``num_val``, ``nlat`` ... ``cache_dir``; the classification datasets
    (``rotated_mnist``, ``image_folder`` / ``patternnet``, see ``eqvit.train.tasks``) use
    ``sample_ratio``, ``root``, ``img_size``, ``val_fraction`` and ``split_seed``;
    ``synthetic_pointclouds`` uses ``num_points``, ``num_train``, ``num_val``, ``sample_ratio``,
    ``train_rotate`` / ``val_rotate`` and ``split_seed``; ``qm9`` uses ``targets``, ``sample_ratio``,
    ``eval_subset``, ``split_seed``, ``root`` (original .xyz files) and ``cache_dir``; ``qm9_generation`` the
    same without ``targets``, plus ``train_rotate`` (random rotations of the training molecules) and ``diffusion``.
    """

    name: str = "shallow_water"
    batch_size: int = 4
    num_val: int = 16
    val_batch_size: int = 8
    seed: int = 0
    nlat: int = 64
    nlon: int = 128
    dt_hours: float = 1.0
    mach: float = 0.2
    steps_per_trajectory: int = 1  # 1: a fresh random initial condition per pair (torch-harmonics' example)
    cache_dir: str | None = None
    # classification
    root: str | None = None  # image folders (one sub-folder per class)
    sample_ratio: float = 1.0  # fraction of the training set used (nested subsets)
    img_size: int | None = None  # square side the images are resized / padded to (default: the model's)
    val_fraction: float = 0.2  # image folders: held out per class
    split_seed: int = 0  # the fixed train / validation split
    # synthetic point clouds
    num_points: int = 64  # points per cloud
    num_train: int = 1000  # training clouds (before sample_ratio); validation: num_val
    train_rotate: str = "none"  # none | z | so3
    val_rotate: str = "so3"  # what the model is scored on
    # QM9 regression (eqvit.train.regression): properties by name, and how much of val / test to score
    targets: list[str] = field(default_factory=lambda: ["gap"])
    eval_subset: int | None = None  # score the first N validation molecules (None: all; test: always all)
    # QM9 generation (eqvit.train.generation): the diffusion process, its loss and its sampler
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)

    def __post_init__(self) -> None:
        check_finite_fields(self, "data")
        for key in ("batch_size", "val_batch_size", "num_val", "nlat", "nlon", "steps_per_trajectory", "num_points"):
            check_range(f"data.{key}", getattr(self, key), 1)
        check_range("data.num_train", self.num_train, 0)
        check_range("data.sample_ratio", self.sample_ratio, 0, strict=True)
        if self.sample_ratio > 1:
            raise ConfigError(f"data.sample_ratio: expected a fraction in (0, 1], got {self.sample_ratio!r}")
        check_range("data.img_size", self.img_size, 1, optional=True)
        check_range("data.eval_subset", self.eval_subset, 1, optional=True)
        if not isinstance(self.targets, list) or not all(isinstance(t, str) for t in self.targets):
            raise ConfigError(f"data.targets: expected a list of property names, got {self.targets!r}")
        for key in ("train_rotate", "val_rotate"):
            check_choice(f"data.{key}", "rotation", getattr(self, key), ROTATIONS)


@dataclass
class OptimConfig:
    name: str = "adam"  # adam | adamw
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        check_finite_fields(self, "optim")
        check_choice("optim.name", "optimiser", self.name, OPTIMIZERS)
        check_range("optim.lr", self.lr, 0, strict=True)
        check_range("optim.weight_decay", self.weight_decay, 0)
        check_range("optim.grad_clip", self.grad_clip, 0, optional=True)


@dataclass
class ScheduleConfig:
    name: str = "cosine"  # cosine | plateau | constant
    warmup_steps: int = 0
    min_lr: float = 1e-5
    patience: int = 2
    factor: float = 0.5

    def __post_init__(self) -> None:
        check_finite_fields(self, "schedule")
        check_choice("schedule.name", "schedule", self.name, SCHEDULES)
        check_range("schedule.warmup_steps", self.warmup_steps, 0)
        check_range("schedule.min_lr", self.min_lr, 0)
        check_range("schedule.patience", self.patience, 0)
        if not 0 < self.factor < 1:
            raise ConfigError(f"schedule.factor: expected a number in (0, 1), got {self.factor!r}")


@dataclass
class TrainConfig:
    """How long and how a run trains.

    Early stopping: ``patience`` is the number of evaluations (every ``eval_every`` steps or
    ``eval_every_epochs`` epochs) without an improvement of the validation metric ``monitor`` after
    which the run stops (``null``, the default: never stops early). ``monitor`` names a metric of the
    task's evaluation; the default (``null``) is the task's own: ``accuracy`` for classification
    (higher is better), ``rel_l2`` for shallow water (lower is better). Other names: a metric whose
    name holds ``acc`` is maximised, any other (``val_loss``, ``rel_l1``, ...) minimised. The model at
    the best evaluation is kept as ``OUT/best.safetensors`` beside ``last.safetensors`` (which stays the
    last step's, for resuming); ``metrics.json`` records ``best_step`` and ``stopped_early``. Not to be
    confused with ``schedule.patience`` (the plateau LR schedule's).

    Multi-step training (shallow water): ``rollout_steps: K`` trains on the loss averaged over K
    autoregressive steps (the model fed its own predictions, gradients through the whole unroll;
    K = 1 is one-step training); ``rollout_schedule`` is a curriculum ``{step: K}`` that sets K from
    that optimiser step on (before its first key K is ``rollout_steps``), e.g. ``{0: 2, 400: 4}``.
    ``rollout_discount`` γ weights step k of the unroll by γ^(k-1) (normalised to sum to one): 1, the
    default, averages the K steps; γ < 1 keeps the one-step error in view while later steps, whose
    errors are larger, would otherwise dominate the loss.
    ``grad_checkpointing`` recomputes each block's activations in backward
    (``model.set_grad_checkpointing()``), so memory grows with K by one block input per step, not by
    every activation of the model (:mod:`eqvit.train.multistep`).
    """

    max_steps: int = 100
    max_epochs: float | None = None  # when set, replaces max_steps (tasks with epochs: classification)
    max_minutes: float | None = None
    eval_every: int = 50  # steps (0: only at the end)
    eval_every_epochs: float | None = None  # when set, replaces eval_every (tasks with epochs)
    log_every: int = 10
    seed: int = 0
    out: str = "runs/default"
    device: str = "cpu"
    threads: int | None = None
    checkpoint_every: int = 0  # 0: only at the end (and on Ctrl-C)
    amp: bool = False  # bf16 autocast
    compile: bool = False  # torch.compile the model
    sdpa_backend: str | None = None  # GPU only: "flash", "efficient", "math", "cudnn"
    patience: int | None = None  # evaluations without a better `monitor` before stopping (null: never)
    monitor: str | None = None  # validation metric (null: the task's; accuracy up, rel_l2 down)
    rollout_steps: int = 1  # K: the loss over K autoregressive steps (1: one-step training)
    rollout_schedule: dict[int, int] = field(default_factory=dict)  # curriculum {from step: K}
    rollout_discount: float = 1.0  # weight γ^(k-1) of unroll step k (1: the plain mean over K)
    grad_checkpointing: bool = False  # recompute block activations in backward (less memory)

    def __post_init__(self) -> None:
        check_finite_fields(self, "train")
        if not self.out.strip():
            raise ConfigError("train.out: expected a folder name, got an empty string")
        check_range("train.rollout_steps", self.rollout_steps, 1)
        for step, k in self.rollout_schedule.items():
            check_range(f"train.rollout_schedule key {step!r} (an optimiser step)", step, 0)
            check_range(f"train.rollout_schedule.{step} (rollout steps K)", k, 1)
        check_range("train.rollout_discount", self.rollout_discount, 0, strict=True)
        check_range("train.max_steps", self.max_steps, 1)
        check_range("train.max_epochs", self.max_epochs, 0, strict=True, optional=True)
        check_range("train.max_minutes", self.max_minutes, 0, strict=True, optional=True)
        check_range("train.eval_every", self.eval_every, 0)
        check_range("train.eval_every_epochs", self.eval_every_epochs, 0, strict=True, optional=True)
        check_range("train.log_every", self.log_every, 1)
        check_range("train.threads", self.threads, 1, optional=True)
        check_range("train.checkpoint_every", self.checkpoint_every, 0)
        check_device("train.device", self.device)
        if self.sdpa_backend is not None:
            check_choice("train.sdpa_backend", "attention backend", self.sdpa_backend, SDPA_BACKENDS)
        check_range("train.patience", self.patience, 1, optional=True)
        if self.patience is not None and not self.eval_every and self.eval_every_epochs is None:
            raise ConfigError(
                "train.patience counts evaluations, but train.eval_every is 0 and train.eval_every_epochs is "
                "unset (only a final evaluation); set one of them"
            )


@dataclass
class ExperimentConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_type(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_type(value, option, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        key_type, value_type = typing.get_args(annotation) or (Any, Any)
        return {
            _check_type(k, key_type, f"{where} key {k!r}"): _check_type(v, value_type, f"{where}.{k}")
            for k, v in value.items()
        }
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        check_finite(where, float(value))
        return float(value)
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if annotation in (str, bool):
        if not isinstance(value, annotation):
            raise ConfigError(f"{where}: expected {annotation.__name__}, got {type(value).__name__} {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, recursively, validating keys and types; errors name the field by
    its dotted path below ``where`` (``""``: the config's top level)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where or 'config'}: unknown key {key!r}{hint} (valid keys: {', '.join(names)})")
        annotation = hints[key]
        field = f"{where}.{key}" if where else str(key)
        if dataclasses.is_dataclass(annotation):
            kwargs[key] = from_dict(annotation, value, field)
        else:
            kwargs[key] = _check_type(value, annotation, field)
    return cls(**kwargs)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping of a YAML file names one key twice (YAML keeps the last silently)."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first})")


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
            try:
                if key in first:
                    raise DuplicateKeyError(key, line, first[key])
                first[key] = line
            except TypeError:  # an unhashable key: the base class reports it
                continue
        return super().construct_mapping(node, deep)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate a YAML experiment config."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except DuplicateKeyError as err:
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); is it a YAML config?") from None
    try:
        return from_dict(ExperimentConfig, data)
    except ConfigError as err:  # name the file once, then the field: "tiny.yaml: optim.lr: expected ..."
        raise ConfigError(f"{path}: {err}") from None
