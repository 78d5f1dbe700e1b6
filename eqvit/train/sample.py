"""``eqvit sample CONFIG --checkpoint CK --num N --out DIR``: molecules from a trained denoiser, and their scores.

Writes into ``DIR``: ``samples.sdf`` and ``samples.xyz`` (every molecule; the SDF with the bonds of EDM's table
and each molecule's validity and SMILES), ``metrics.json`` (:func:`eqvit.chem.metrics.molecule_metrics`: atom and
molecule stability, validity, uniqueness, novelty against the training split, PoseBusters pass rates; with the
sampling settings, the time and the load) and ``molecules.png`` (RDKit depictions of the first valid molecules).
Needs the ``gen`` extra (RDKit, PoseBusters): without it, a :class:`~eqvit.utils.MissingExtraError`
before anything is loaded.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from eqvit.train.config import ExperimentConfig


def score_molecules(
    molecules: list, task: Any, out: Path, energy_limit: int = 100, depict_count: int = 24
) -> dict[str, Any]:
    """Write ``samples.sdf``, ``samples.xyz`` and ``molecules.png`` of ``molecules`` into ``out``; return their
    :func:`~eqvit.chem.metrics.molecule_metrics` (novelty against ``task``'s training split)."""
    from eqvit.chem.io import depict, write_sdf, write_xyz
    from eqvit.chem.metrics import molecule_metrics
    from eqvit.data.qm9_generation import training_smiles
    from eqvit.utils import cache_dir

    write_xyz(molecules, out / "samples.xyz")
    smiles = write_sdf(molecules, out / "samples.sdf")
    known = training_smiles(task.splits["train"], Path(task.cfg.cache_dir or cache_dir() / "qm9"))
    metrics = molecule_metrics(molecules, known, energy_limit=energy_limit)
    valid = [s for s in smiles if s is not None]
    if valid:
        depict(valid[:depict_count], out / "molecules.png")
    return metrics


def sample_checkpoint(
    config: ExperimentConfig,
    checkpoint: str | Path,
    num: int,
    out: str | Path,
    seed: int = 0,
    steps: int | None = None,
    energy_limit: int = 100,
    progress: bool = True,
) -> dict[str, Any]:
    """Sample ``num`` molecules from ``checkpoint`` of ``config``'s denoiser and write the files of the module
    docstring into ``out``; returns what ``metrics.json`` holds. ``steps`` overrides ``data.diffusion.steps``."""
    from tqdm.auto import tqdm

    from eqvit.chem.rdkit_mols import require_gen
    from eqvit.train.engine import load_for_evaluation
    from eqvit.train.generation import QM9GenerationTask

    require_gen("eqvit sample")
    if config.data.name != "qm9_generation":
        raise ValueError(
            f"eqvit sample needs a generative config (data.name: qm9_generation, e.g. configs/dip_qm9.yaml), "
            f"got data.name {config.data.name!r}"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if config.train.threads:
        import torch

        torch.set_num_threads(config.train.threads)
    model, task = load_for_evaluation(config, checkpoint)
    if not isinstance(task, QM9GenerationTask):
        raise ValueError(f"expected the qm9_generation task, got {type(task).__name__}")
    diffusion = config.data.diffusion
    begin = time.perf_counter()
    with tqdm(total=num, unit="mol", desc="sampling", disable=not progress, dynamic_ncols=True) as bar:
        molecules = task.sample(model, num, seed, steps, progress=bar.update)
    sample_seconds = time.perf_counter() - begin
    metrics = score_molecules(molecules, task, out, energy_limit)
    result = {
        **metrics,
        "checkpoint": str(checkpoint),
        "model": config.model.name,
        "num": num,
        "seed": seed,
        "sampler": diffusion.sampler,
        "steps": steps or diffusion.steps,
        "schedule": diffusion.schedule,
        "sample_seconds": sample_seconds,
        "load_avg_1min": os.getloadavg()[0],
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    }
    (out / "metrics.json").write_text(json.dumps(result, indent=2))
    if progress:
        shown = ("atom_stability", "molecule_stability", "validity", "uniqueness", "novelty")
        print(", ".join(f"{k} {100 * result[k]:.1f}%" for k in shown if k in result))
        print(
            f"wrote {out}/samples.sdf, samples.xyz, metrics.json" + (", molecules.png" if result["num_valid"] else "")
        )
    return result
