"""The benchmarks, as package code: ``eqvit bench NAME [args]`` runs ``eqvit.bench.NAME:main``.

Each benchmark is a module here with a ``main()`` that parses ``sys.argv[1:]`` (or the ``argv`` it is
given); ``benchmarks/NAME.py`` in the source checkout is a thin driver that calls the same ``main``,
so ``python benchmarks/NAME.py ...``, ``eqvit bench NAME ...`` and ``python -m eqvit.bench.NAME ...``
are one program, and an installed wheel runs them without the repository. Shared helpers live here
too: :mod:`eqvit.bench.device` (device choice, timing, the flash-attention check) and
:mod:`eqvit.bench._paths` (where results and configs are).

The modules import torch, timm and the peers they measure only when run, so listing is cheap.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

# name -> one line (kept here, so that listing imports no benchmark)
BENCHMARKS: dict[str, str] = {
    "ablate": "cross-group ablations on the sphere, images and point clouds (swe | images | points | attention)",
    "compile": "torch.compile (Inductor) against eager per family: time, graph breaks, first-call time",
    "device": "the device and the flash-attention SDPA check as JSON (benchmarks/_device.py)",
    "dip_qm9": "DiP molecule generation on QM9 at equal CPU time: trivial vs T (and O) frames, EDM/RDKit metrics",
    "export": "torch.export and ONNX (onnxruntime) of one model per family, training and inference form",
    "fold_agreement": "eqvit.fold against the training form for every registered model (float64)",
    "groups_timing": "cold construction time of the Platonic groups",
    "import_time": "start-up cost of `import eqvit` and `eqvit list` against `import torch, timm`",
    "kill_resume": "kill -9 / SIGINT / SIGTERM of a real `eqvit train` at random moments, --resume: bit-exact tries",
    "o2_data_efficiency": "data efficiency of O(2)-subgroup ViTs on rotated MNIST or an image folder (--image-folder)",
    "o2_gsets": "MLP G-sets of a D4 ViT: accuracy against the A1 fraction of the hidden layer (seed Fig. 6)",
    "o2_equivariance": "invariance and restriction errors of the O(2)-subgroup ViTs",
    "o2_speed": "forward time, parameters and FLOPs of the D4 O(2)-subgroup ViT against timm",
    "report": "docs/benchmarks.md from the canonical results (--check: the page matches them)",
    "qm9": "QM9 property regression at equal CPU time: trivial, T, O, I frames and a plain transformer",
    "platonic_head_fit": "training loss of the Platonic image classifiers per frame-pooling head",
    "platonic_pointcloud": "Platonic frames on point clouds: accuracy under random SO(3) test rotations",
    "platonic_speed": "Platonic Transformer forward time against a timm ViT of equal |G|·C width",
    "scale_speed": "ViT-S/B: timm vs eqvit's Schur-layout D4 models vs octic-vits (time, FLOPs, training)",
    "so3vit_vs_s2transformer": "SO3ViT vs the S2Transformer baseline: time, training memory, parameters",
    "so3vit_sweep": "the SO(3)-RoPE seed's grid over depth, heads and width: error vs time per epoch",
    "swe_accuracy": "equal wall-clock accuracy on shallow water: SO3ViT, APE ablation, S2Transformer",
    "swe_table1": "the SO(3)-RoPE seed's Table 1 rows on shallow water at the seed's budget (100 epochs)",
    "wigner_timing": "time of the real Wigner-D matrices on a batch of random poses",
}

# benchmarks/<script>.py for each benchmark (the device helpers keep their old script name)
SCRIPTS = {name: ("_device" if name == "device" else name) for name in BENCHMARKS}


def list_benchmarks() -> list[str]:
    """The benchmark names, sorted."""
    return sorted(BENCHMARKS)


def load(name: str):
    """The module ``eqvit.bench.NAME``; an unknown name is a ValueError listing the valid ones."""
    aliases = {script: name for name, script in SCRIPTS.items()}
    name = aliases.get(name, name)
    if name not in BENCHMARKS:
        from eqvit.utils import unknown_name_error

        raise unknown_name_error("benchmark", name, list_benchmarks())
    return importlib.import_module(f"{__name__}.{name}")


def run(name: str, argv: Sequence[str] = ()) -> Any:
    """Run benchmark ``name`` with command-line arguments ``argv`` (as ``eqvit bench NAME ARGV...``)."""
    module = load(name)
    if not {"-h", "--help"} & set(argv):  # outside a checkout the default results folder may not exist yet
        from eqvit.bench._paths import results_dir

        results_dir().mkdir(parents=True, exist_ok=True)
    saved = sys.argv
    sys.argv = [f"eqvit bench {name}", *argv]
    try:
        return module.main()
    finally:
        sys.argv = saved
