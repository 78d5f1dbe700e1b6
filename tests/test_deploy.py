"""Deployment of every family, training form and inference form (eqvit.fold): torch.export with a free batch
size, and ONNX through the dynamo exporter, run in onnxruntime."""

from __future__ import annotations

import pytest
import torch
from helpers import randomise_

import eqvit
from eqvit.bench.export import FAMILIES, FORMS  # one model per family, the training and the folded form
from eqvit.deploy import example_inputs, export_onnx, export_program, relative_error


def build(name: str, form: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = randomise_(eqvit.create_model(name)).eval()
    return eqvit.fold(model) if form == "folded" else model


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", FAMILIES)
def test_export_with_a_free_batch_size(name, form):
    model = build(name, form)
    program = export_program(model)  # exported at batch 2
    for batch in (1, 5):
        inputs = example_inputs(model, batch, seed=batch)
        with torch.no_grad():
            expected = model(*inputs)
        got = program.module()(*inputs)
        assert got.shape == expected.shape and got.shape[0] == batch
        assert relative_error(got, expected) <= 1e-5


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", FAMILIES)
def test_onnx_matches_eager_in_onnxruntime(name, form, tmp_path):
    model = build(name, form)
    path = tmp_path / f"{name}.onnx"
    err = export_onnx(model, path)  # checked at batch 3 against eager
    assert path.is_file() and err <= 1e-4


def test_onnx_export_refuses_a_mismatch_and_writes_nothing(tmp_path):
    """The check can fail: a tolerance below float32 round-off refuses the file."""
    path = tmp_path / "m.onnx"
    with pytest.raises(ValueError, match="differs from eager PyTorch in onnxruntime"):
        export_onnx(build("platonic_points_tiny", "folded"), path, tolerance=0.0)
    assert not path.exists() and not list(tmp_path.iterdir())
