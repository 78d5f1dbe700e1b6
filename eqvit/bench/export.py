"""Deployment of one model per family: ``torch.export`` with a free batch size and ONNX in onnxruntime.

For each family's tiny model (o2vit square and hexagonal, Platonic image and points, SO3ViT, the QM9
regressor) in both forms (the training form and ``eqvit.fold``'s inference form), in float32 and
``eval()``:

* ``export``: :func:`eqvit.deploy.export_program` at batch 2, run at batch 3, against eager PyTorch;
* ``onnx``: :func:`eqvit.deploy.export_onnx` (the dynamo exporter at batch 2, onnxruntime at batch 3,
  refused above 1e-4 relative).

The figures are ``max |got - eager| / max |eager|``. Writes JSON and prints a table.

Usage: ``python benchmarks/export.py [--models NAME ...] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

import eqvit
from eqvit.bench._paths import results_dir
from eqvit.deploy import CHECK_BATCH, example_inputs, export_onnx, export_program, relative_error
from eqvit.testing import randomise_parameters_

FAMILIES = (
    "o2vit_square_tiny",
    "o2vit_hex_tiny",
    "platonic_image_tiny",
    "platonic_points_tiny",
    "so3vit_tiny",
    "platonic_qm9_tiny",
)
FORMS = ("train", "folded")


def deploy_row(name: str, form: str, seed: int = 0) -> dict:
    """One model in one form: the export and ONNX errors against eager PyTorch, and their times."""
    torch.manual_seed(seed)
    model = randomise_parameters_(eqvit.create_model(name), seed).eval()  # noised: a zero head agrees trivially
    if form == "folded":
        model = eqvit.fold(model)
    check = example_inputs(model, CHECK_BATCH, seed=1)
    row: dict = dict(model=name, form=form)
    start = time.perf_counter()
    program = export_program(model)
    with torch.no_grad():
        row["export_rel_err"] = relative_error(program.module()(*check), model(*check))
    row["export_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        row["onnx_rel_err"] = export_onnx(model, Path(folder) / f"{name}.onnx")
    row["onnx_seconds"] = time.perf_counter() - start
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(FAMILIES), help="model names (default: one per family)")
    parser.add_argument("--out", default=str(results_dir() / "export.json"))
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(eqvit.list_models()))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; `eqvit list` names the registered ones")
    warnings.filterwarnings("ignore")  # the exporters' notes on the dynamic batch axis
    rows = []
    print(f"{'model':<22} {'form':<6} {'torch.export':>13} {'ONNX (onnxruntime)':>19} {'seconds':>8}")
    for name in args.models:
        for form in FORMS:
            row = deploy_row(name, form)
            rows.append(row)
            seconds = row["export_seconds"] + row["onnx_seconds"]
            print(
                f"{name:<22} {form:<6} {row['export_rel_err']:>13.1e} {row['onnx_rel_err']:>19.1e} {seconds:>8.1f}",
                flush=True,
            )
    meta = dict(torch=torch.__version__, platform=platform.platform(), loadavg=os.getloadavg(),
                export_batch=2, check_batch=CHECK_BATCH)  # fmt: skip
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
