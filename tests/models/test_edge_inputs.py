"""Edge inputs: an empty batch works, a point cloud without points and an
input of another dtype than the model's parameters are ValueErrors naming what was expected and what came.
Checked over every registered tiny model."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

import eqvit
from eqvit.geometry.domain import PointCloudDomain, PointDomain, check_dtype

TINY = eqvit.list_models("*tiny")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch-harmonics announces changed defaults
        yield


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return eqvit.create_model(name).eval()


def _input(model: nn.Module, batch: int = 2, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(0)
    return model.domain.random_input(batch, model.in_chans, generator=gen, dtype=dtype)


def _call(model: nn.Module, x):
    return model(*x) if isinstance(x, tuple) else model(x)


def _cast(x, dtype):
    return tuple(t.to(dtype) for t in x) if isinstance(x, tuple) else x.to(dtype)


def _output_shape(model: nn.Module, batch: int) -> tuple[int, ...]:
    if getattr(model, "output_action", "same") == "invariant":
        return (batch, model.out_chans)
    if isinstance(model.domain, PointCloudDomain):  # point-cloud denoisers (dip_*): one output row per point
        return (batch, model.domain.num_points, model.out_chans)
    return (batch, model.out_chans, *model.domain.shape)


@pytest.mark.parametrize("name", TINY)
def test_empty_batch_gives_an_empty_output(name):
    model = _model(name)
    with torch.no_grad():
        out = _call(model, _input(model, batch=0))
    assert out.shape == _output_shape(model, 0)
    assert out.dtype == torch.float32


def test_point_cloud_without_points_is_a_value_error():
    model = _model("platonic_points_tiny")
    pos, feat = torch.zeros(2, 0, 3), torch.zeros(2, 0, model.in_chans)
    with pytest.raises(ValueError, match=r"expected at least one point per cloud \(N >= 1\), got pos \[2, 0, 3\]"):
        model(pos, feat)
    with pytest.raises(ValueError, match="at least one point"):
        PointCloudDomain(3).check((pos, feat))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", TINY)
def test_other_float_dtype_is_a_value_error_naming_both(name, dtype):
    model = _model(name)
    x = _input(model, dtype=dtype)
    got = str(dtype).replace("torch.", "")
    with pytest.raises(ValueError, match=rf"dtype float32 \(the model's parameter dtype\), got {got}"):
        with torch.no_grad():
            _call(model, x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("name", TINY)
def test_integer_input_is_a_value_error(name, dtype):
    model = _model(name)
    x = _cast(_input(model), dtype)
    got = str(dtype).replace("torch.", "")
    with pytest.raises(ValueError, match=rf"expected a floating-point .* of dtype float32 .*got {got}"):
        with torch.no_grad():
            _call(model, x)


@pytest.mark.parametrize("name", TINY)
def test_float64_model_takes_float64_input(name):
    if name.startswith("s2transformer"):
        pytest.xfail("torch-harmonics' DISCO convolution computes in float32: SphericalTransformer has no float64 mode")
    model = _model(name).double()
    with torch.no_grad():
        out = _call(model, _input(model, dtype=torch.float64))
    assert out.dtype == torch.float64 and torch.isfinite(out).all()


@pytest.mark.parametrize("name", TINY)
def test_bf16_input_under_autocast(name):
    model = _model(name)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = _call(model, _input(model, dtype=torch.bfloat16))
    assert out.shape == _output_shape(model, 2) and torch.isfinite(out).all()


def test_check_dtype_rules():
    x = torch.zeros(2, dtype=torch.float64)
    check_dtype(x, torch.float64)
    check_dtype(x, None)  # nothing to compare with
    with pytest.raises(
        ValueError, match=re.escape("cast the input with .to(torch.float32) or the model with .to(torch.float64)")
    ):
        check_dtype(x, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        check_dtype(x.bfloat16(), torch.float32)  # the autocast dtype
        with pytest.raises(ValueError, match="got float16"):
            check_dtype(x.half(), torch.float32)
    domain = PointDomain(torch.zeros(3, 2).double().numpy(), name="three points")
    domain.check(torch.zeros(1, 2, 3), 2, torch.float32)
    with pytest.raises(ValueError, match="got float64"):
        domain.check(torch.zeros(1, 2, 3, dtype=torch.float64), 2, torch.float32)
