"""What several test modules share: weight noise, the registry's test models and their inputs, the CLI's
tiny run config and error checks, and small QM9 files. One import path: ``from helpers import ...``
(``tests`` is on ``pythonpath``, see pyproject.toml)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

import eqvit
from eqvit.cli import main
from eqvit.data import qm9
from eqvit.geometry.domain import PointCloudDomain
from eqvit.models import is_model
from eqvit.testing import randomise_parameters_ as randomise_

__all__ = [
    "ATTENTION_LAYOUTS",
    "PLANAR_SCHEMES",
    "ROOT",
    "SCHEME_LAYOUTS",
    "TEST_MODELS",
    "TINY_MNIST_RUN",
    "TINY_RUN",
    "assert_one_paragraph",
    "build",
    "call",
    "cli",
    "mnist_config",
    "output_shape",
    "random_input",
    "randomise_",
    "scheme_layout_kwargs",
    "tiny_variant",
    "write_config",
    "write_xyz",
    "write_yaml",
]

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root (configs/, benchmarks/, README.md)."""

# ------------------------------------------------------------------------------------------------
# the registry's models


def tiny_variant(name: str) -> str:
    """``<family>_<size>`` -> ``<family>_tiny`` if that is registered, else ``name`` itself."""
    family = name.rsplit("_", 1)[0]
    tiny = f"{family}_tiny"
    return tiny if is_model(tiny) else name


TEST_MODELS = sorted({tiny_variant(name) for name in eqvit.list_models()})
"""One model per registered family: its tiny variant where there is one."""


@cache
def _pristine(name: str) -> nn.Module:
    torch.manual_seed(0)
    return eqvit.create_model(name)


def build(name: str) -> nn.Module:
    """A fresh copy of the registered model ``name`` with its default init (cached construction)."""
    return copy.deepcopy(_pristine(name))


def random_input(
    model: nn.Module, batch: int = 2, dtype: torch.dtype = torch.float32, seed: int = 0
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """What the model's domain feeds: a field ``[B, C, *shape]``, or ``(pos, feat)`` for point clouds."""
    gen = torch.Generator().manual_seed(seed)
    return model.domain.random_input(batch, model.in_chans, generator=gen, dtype=dtype)


def call(model: nn.Module, x: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    return model(*x) if isinstance(x, tuple) else model(x)


def output_shape(model: nn.Module, batch: int) -> tuple[int, ...]:
    """Dense models output a field on the input domain; invariant ones (classifiers) one vector per sample;
    point-cloud denoisers (dip_*) one output row per point."""
    if getattr(model, "output_action", "same") == "invariant":
        return (batch, model.out_chans)
    if isinstance(model.domain, PointCloudDomain):
        return (batch, model.domain.num_points, model.out_chans)
    return (batch, model.out_chans, *model.domain.shape)


PLANAR_SCHEMES = ("invariant_ape", "frame_rope", "none")
ATTENTION_LAYOUTS = ("coupled", "irrepwise", "frames")

SCHEME_LAYOUTS: list[tuple[str, str, str | None]] = (
    [("o2vit_square_tiny", p, a) for p in PLANAR_SCHEMES for a in ATTENTION_LAYOUTS]
    + [("o2vit_hex_tiny", p, a) for p in PLANAR_SCHEMES for a in ATTENTION_LAYOUTS]
    + [("platonic_image_tiny", p, a) for p in PLANAR_SCHEMES for a in ATTENTION_LAYOUTS]
    + [("platonic_points_tiny", p, a) for p in ("frame_rope", "none") for a in ATTENTION_LAYOUTS]
    # sphere models: the combinations beside the registered one (frame RoPE with frames / coupled heads)
    + [("platonic_sphere_tiny", "frame_rope", "irrepwise")]
    + [("platonic_sphere_tiny", "none", a) for a in ATTENTION_LAYOUTS]
    + [("so3vit_tiny", p, None) for p in ("so3rope", "none", "learned")]
)
"""Every (model, positional scheme, attention layout) combination the builders accept; ``None``: the family
has one layout."""


def scheme_layout_kwargs(posenc: str, attention: str | None) -> dict:
    return {"posenc": posenc} if attention is None else {"posenc": posenc, "attention": attention}


# ------------------------------------------------------------------------------------------------
# the command line

TINY_RUN = {
    "model": {"name": "so3vit_tiny", "kwargs": {"residual": True}},
    "data": {"batch_size": 2, "num_val": 2, "val_batch_size": 2},
    "train": {"max_steps": 2, "eval_every": 0, "log_every": 1, "threads": 1},
}
"""A two-step shallow-water run of so3vit_tiny: the smallest config the CLI trains."""


def write_config(folder: Path, cache_dir: str, name: str = "tiny.yaml", **sections) -> Path:
    """TINY_RUN with ``sections`` merged in (``model={...}`` updates the model section, etc.)."""
    data = json.loads(json.dumps(TINY_RUN))
    data["data"]["cache_dir"] = cache_dir
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


TINY_MNIST_RUN = {
    "model": {
        "name": "o2vit_square_tiny",
        "kwargs": {"img_size": 32, "patch_size": 8, "in_chans": 1, "num_classes": 10},
    },
    "data": {"name": "rotated_mnist", "sample_ratio": 0.02, "batch_size": 16, "val_batch_size": 500},
    "optim": {"name": "adamw", "weight_decay": 0.05},
    "train": {"max_epochs": 2, "eval_every_epochs": 1, "log_every": 1, "threads": 1},
}
"""A two-epoch rotated-MNIST run of o2vit_square_tiny on 2 % of the digits: the smallest classification run."""


def mnist_config(**sections) -> dict:
    """TINY_MNIST_RUN with ``sections`` merged in."""
    cfg = json.loads(json.dumps(TINY_MNIST_RUN))
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def write_yaml(folder: Path, data: dict, name: str = "tiny.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def cli(capsys, *args: str) -> tuple[int, str]:
    """``eqvit ARGS`` in this process: its exit code and what it printed to stderr."""
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def assert_one_paragraph(err: str, *needles: str) -> None:
    """A user error: one ``eqvit: error:`` line holding every needle, and no traceback."""
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("eqvit: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ------------------------------------------------------------------------------------------------
# QM9 files


def write_xyz(folder: Path, count: int, seed: int = 0, min_atoms: int = 3, max_atoms: int = 6) -> list[dict]:
    """``count`` molecules in the original QM9 .xyz format (Fortran ``*^`` exponents included); returns
    what was written: index, elements, positions, the 15 properties."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for k in range(count):
        n = int(rng.integers(min_atoms, max_atoms + 1))
        elements = list(rng.choice(list(qm9.ELEMENTS), size=n))
        pos = rng.normal(size=(n, 3)) * 1.5
        props = rng.normal(size=15)
        props[0:3] = np.abs(props[0:3]) * 100  # rotational constants
        index = k + 1
        lines = [str(n), "gdb " + str(index) + "\t" + "\t".join(f"{v:.6f}" for v in props)]
        for e, p in zip(elements, pos, strict=True):
            x = f"{p[0]:.10f}"
            if abs(p[0]) < 1e-3:
                x = f"{p[0] * 1e6:.6f}*^-6"  # the format writes small numbers like this
            lines.append(f"{e}\t{x}\t{p[1]:.10f}\t{p[2]:.10f}\t0.1")
        lines += ["\t".join(["100.0"] * (3 * n - 6)), "C\tC", "InChI=1S/x\tInChI=1S/x"]
        (folder / f"dsgdb9nsd_{index:06d}.xyz").write_text("\n".join(lines) + "\n")
        written.append({"index": index, "elements": elements, "pos": pos, "props": props})
    return written
