"""eqvit.bench.device: device choice, autocast, the flash-attention check (CUDA parts skip without CUDA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eqvit.bench import device as _device

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


def test_pick_device_cpu():
    assert _device.pick_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert _device.pick_device(None).type == expected
    assert _device.pick_device("auto").type == expected


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_pick_device_cuda_missing_exits(name):
    with pytest.raises(SystemExit, match="CUDA is not available"):
        _device.pick_device(name)


def test_pick_device_bad_name_exits():
    with pytest.raises(SystemExit):
        _device.pick_device("not-a-device")


def test_autocast_noop_on_cpu():
    cpu = torch.device("cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with _device.autocast(cpu, enabled=False):
        assert not torch.is_autocast_enabled("cpu")
        assert (a @ b).dtype == torch.float32
    with _device.autocast(cpu, enabled=True):  # asked for: CPU bf16 autocast
        assert (a @ b).dtype == torch.bfloat16
    assert _device.amp_dtype(False) == "float32"


def test_sync_time_and_memory_on_cpu():
    cpu = torch.device("cpu")
    _device.sync(cpu)
    assert _device.time_ms(lambda: torch.randn(8, 8) @ torch.randn(8, 8), cpu) >= 0
    _device.reset_peak_memory(cpu)
    assert _device.peak_memory_mb(cpu) is None
    assert _device.device_info(cpu) == {"device": "cpu"}


def test_flash_checks_are_na_on_cpu():
    cpu = torch.device("cpu")
    assert _device.flash_sdpa_check(cpu) == {"device": "cpu", "flash": "n/a"}
    model = torch.nn.Linear(4, 4)
    assert _device.flash_model_check(model, torch.randn(2, 4), cpu) == {"device": "cpu", "flash": "n/a"}
    assert _device.backend_used(None) == "default (cpu)"
    with _device.sdpa_context(cpu, {"flash": "ok"}):  # a no-op on the CPU
        F.scaled_dot_product_attention(*torch.randn(3, 1, 2, 4, 8).unbind(0))


def test_flash_reasons_rules():
    q32 = torch.empty(1, 2, 16, 32, dtype=torch.float32, device="meta")
    reasons = _device.flash_reasons(q32, q32, q32)
    assert any("cuda" in r.lower() for r in reasons) and any("float16" in r for r in reasons)
    big = torch.empty(1, 2, 16, 512, dtype=torch.bfloat16, device="meta")
    assert any("> 256" in r for r in _device.flash_reasons(big, big, big))
    assert _device.padded_head_dim(2) == 8 and _device.padded_head_dim(32) == 32 and _device.padded_head_dim(20) == 24
    call = {"q": [1, 2, 16, 32], "k": [1, 2, 16, 32], "v": [1, 2, 16, 32], "dtypes": ["bfloat16"]}
    assert _device._call_reasons(call) == []
    assert _device._call_reasons({**call, "dtypes": ["float32"]})


def test_recorder_sees_the_dispatched_kernel():
    q = torch.randn(1, 2, 16, 8)
    with torch.no_grad(), _device.record_sdpa() as rec:
        F.scaled_dot_product_attention(q, q, q)
    summary = rec.summary()
    assert sum(summary["backends"].values()) == 1
    assert summary["head_dims"] == [8]


def test_default_shapes_cover_the_model_head_dims():
    dims = {shape[-1] for shape in _device.DEFAULT_SHAPES}
    assert {2, 8, 16, 20, 24, 32, 40, 64} <= dims


# ------------------------------------------------------------------------------------------------
# CUDA: flash eligibility is actually checked


@cuda
def test_flash_sdpa_check_cuda():
    dev = torch.device("cuda")
    shapes = [("hd32", 1, 4, 128, 32), ("hd2", 1, 4, 128, 2), ("hd512", 1, 2, 64, 512)]
    result = _device.flash_sdpa_check(dev, torch.bfloat16, shapes)
    rows = {r["label"]: r for r in result["shapes"]}
    assert rows["hd32"]["ran"] and rows["hd32"]["eligible"] and not rows["hd32"]["padded"]
    assert rows["hd32"]["max_abs_diff_vs_math"] < 5e-2
    assert not rows["hd512"]["ran"] and not rows["hd512"]["eligible"]
    # head_dim 2 is not a multiple of 8: older PyTorch refuses it on flash, newer pads it to 8 inside
    # SDPA. Either way the check must say so.
    assert rows["hd2"]["padded"] and rows["hd2"]["padded_head_dim"] == 8
    assert rows["hd2"]["ran"] or "error" in rows["hd2"]
    assert result["flash"].startswith("failed for")


@cuda
def test_flash_sdpa_check_cuda_float32_fails():
    result = _device.flash_sdpa_check(torch.device("cuda"), torch.float32, [("hd32 fp32", 1, 4, 128, 32)])
    row = result["shapes"][0]
    assert not row["ran"] and not row["eligible"] and row["error"]


@cuda
def test_flash_model_check_cuda():
    import eqvit

    dev = torch.device("cuda")
    model = eqvit.create_model("o2vit_square_tiny").to(dev)
    x = torch.randn(1, model.in_chans, *model.domain.shape, device=dev)
    ok = _device.flash_model_check(model, x, dev, amp=True)
    assert ok["flash"] == "ok", ok
    assert ok["default_backends"] and ok["flash_calls"] > 0
    fp32 = _device.flash_model_check(model, x, dev, amp=False)  # float32 attention: flash cannot take it
    assert fp32["flash"].startswith("not flash-eligible"), fp32
    with _device.sdpa_context(dev, ok), torch.no_grad(), _device.autocast(dev, True), _device.record_sdpa() as rec:
        model(x)
    assert set(rec.backends) == {"flash"}
