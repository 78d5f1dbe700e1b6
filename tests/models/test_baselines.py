"""Baselines: the torch-harmonics S2Transformer wrapper and SO3ViT's learned-APE ablation."""

from __future__ import annotations

import copy
import json
import statistics
import subprocess
import sys

import numpy as np
import pytest
import timm
import torch
from helpers import ROOT, randomise_

from eqvit import models
from eqvit.geometry.latlon import latlon_points
from eqvit.groups import get_group
from eqvit.models.baselines import S2TransformerBaseline, default_theta_cutoff
from eqvit.testing import EquivarianceError, assert_equivariant

BENCHMARK = ROOT / "benchmarks" / "so3vit_vs_s2transformer.py"


TABLE_1 = {  # the SO(3)-RoPE seed's Table 1: S2Transformer parameter counts (millions, 2 decimals)
    "s2transformer_4x128": 0.53,
    "s2transformer_4x256": 2.12,
    "s2transformer_4x512": 8.43,
    "s2transformer_8x256": 4.22,
}


def test_s2transformer_tiny_shapes_and_interface():
    model = models.create_model("s2transformer_tiny", in_chans=3, out_chans=2)
    assert model.group is None and model.in_chans == 3 and model.out_chans == 2
    assert model.domain.shape == (16, 32) and model.domain.points.shape == (16 * 32, 3)
    y = model(torch.randn(2, 3, 16, 32))
    assert y.shape == (2, 2, 16, 32) and torch.isfinite(y).all()
    assert model.config["embed_dim"] == 16 and model.config["attention_mode"] == "neighborhood"


def test_vit_ape_tiny_shapes_and_interface():
    model = models.create_model("vit_ape_tiny")
    assert model.group is None and model.config["posenc"] == "ape"
    y = model(torch.randn(2, 3, *model.domain.shape))
    assert y.shape == (2, 3, 642)


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        (
            "s2transformer_tiny",
            (2, 3, 64, 128),
            "expected input of shape [B, 3, 16, 32] on the 16x32 equiangular grid",
        ),
        ("s2transformer_tiny", (2, 4, 16, 32), "got [2, 4, 16, 32]"),
        ("vit_ape_tiny", (2, 3, 16, 32), "expected input of shape [B, 3, 642] on icosphere level 3"),
    ],
)
def test_wrong_input_shape_is_a_value_error(name, shape, message):
    model = models.create_model(name)
    with pytest.raises(ValueError) as err:
        model(torch.randn(*shape))
    assert message in str(err.value)


def test_full_size_error_message_names_the_64x128_grid():
    # The domain is cheap to build without the network; the message format is the contract.
    from eqvit.geometry.domain import PointDomain

    domain = PointDomain(latlon_points(64, 128).numpy(), shape=(64, 128), name="the 64x128 equiangular grid")
    with pytest.raises(
        ValueError,
        match=r"expected input of shape \[B, 3, 64, 128\] on the 64x128 equiangular grid, got \[2, 3, 10242\]",
    ):
        domain.check(torch.randn(2, 3, 10242), 3)


def test_grid_points_are_torch_harmonics_equiangular_grid():
    pts = latlon_points(64, 128).numpy()
    assert pts.shape == (64 * 128, 3)
    np.testing.assert_allclose(np.linalg.norm(pts, axis=1), 1.0, atol=1e-12)
    grid = pts.reshape(64, 128, 3)
    np.testing.assert_allclose(grid[0], [[0, 0, 1]] * 128, atol=1e-12)  # row 0: north pole (colatitude 0)
    np.testing.assert_allclose(grid[-1], [[0, 0, -1]] * 128, atol=1e-12)
    colat = np.arccos(np.clip(grid[:, 0, 2], -1, 1))
    np.testing.assert_allclose(np.diff(colat), np.pi / 63, atol=1e-12)  # equiangular, poles included
    np.testing.assert_allclose(
        grid[32, :, :2],
        np.stack([np.cos(2 * np.pi * np.arange(128) / 128), np.sin(2 * np.pi * np.arange(128) / 128)], -1)
        * np.sin(colat[32]),
        atol=1e-12,
    )


def test_grid_points_match_the_shallow_water_data_grid():
    model = models.create_model("s2transformer_tiny")
    np.testing.assert_allclose(model.domain.points, latlon_points(16, 32).numpy(), atol=1e-12)


def test_theta_cutoff_default_is_a_7x7_window():
    # SphericalTransformer's block default: a disk of the area of 49 equatorial grid cells.
    dtheta = np.pi / 63
    assert np.isclose(np.pi * default_theta_cutoff(64) ** 2, 49 * dtheta**2)
    assert np.isclose(default_theta_cutoff(64), 0.19694, atol=1e-5)


def test_timm_create_model():
    model = timm.create_model("s2transformer_tiny", out_chans=1)
    assert isinstance(model, S2TransformerBaseline)
    assert model(torch.randn(1, 3, 16, 32)).shape == (1, 1, 16, 32)
    assert isinstance(timm.create_model("vit_ape_tiny"), models.EquivariantViT)
    with pytest.raises(ValueError, match="pretrained"):
        timm.create_model("s2transformer_tiny", pretrained=True)


def test_passthrough_and_bad_kwargs():
    model = models.create_model("s2transformer_tiny", residual=True, drop_path_rate=0.1, attention_mode="global")
    assert model.model.residual_prediction and model.config["drop_path_rate"] == 0.1
    assert model(torch.randn(1, 3, 16, 32)).shape == (1, 3, 16, 32)
    with pytest.raises(ValueError, match="pos_embed"):
        models.create_model("s2transformer_tiny", pos_embd="spectral")
    with pytest.raises(ValueError, match="depth="):
        models.create_model("s2transformer_tiny", num_layers=2)
    with pytest.raises(ValueError, match="in_chans == out_chans"):
        models.create_model("s2transformer_tiny", residual=True, out_chans=1)


def test_s2transformer_configs_match_table_1_parameter_counts():
    # Count without building the DISCO tensors of the 64 x 128 grid: parameters do not depend on
    # the grid size, so a small grid gives Table 1's counts.
    for name, millions in TABLE_1.items():
        model = models.create_model(name, img_size=(8, 16), pos_embed="none")
        assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == millions, name


def test_full_size_s2transformer_settings():
    model = models.create_model("s2transformer_4x128")
    assert model.domain.shape == (64, 128) and model.num_tokens == 64 * 128
    cfg = model.config
    assert (cfg["scale_factor"], cfg["grid"], cfg["attention_mode"], cfg["pos_embed"]) == (
        1,
        "equiangular",
        "neighborhood",
        "spectral",
    )
    assert np.isclose(model.model.blocks[0].self_attn.theta_cutoff, default_theta_cutoff(64))


def test_learned_ape_breaks_icosahedral_equivariance():
    ico = get_group("I")
    x = torch.randn(2, 3, 642, dtype=torch.float64)
    torch.manual_seed(0)
    so3vit = randomise_(models.create_model("so3vit_tiny"))
    assert so3vit.double()(x).abs().max() > 1e-2  # a non-zero output, so the check can fail
    assert_equivariant(so3vit, ico, inputs=x)  # SO(3)-RoPE: equivariant
    torch.manual_seed(0)
    ape = randomise_(models.create_model("vit_ape_tiny"))
    assert ape.double()(x).abs().max() > 1e-2
    with pytest.raises(EquivarianceError) as err:
        assert_equivariant(ape, ico, inputs=x)
    report = err.value.report
    assert report.max_relative_error > 1e-3
    assert report.rows[0][2] < 1e-12  # the identity is fine; the other rotations are not
    assert sum(row[2] > 1e-3 for row in report.rows) == 59


def _load_benchmark():
    from eqvit.bench import so3vit_vs_s2transformer

    return so3vit_vs_s2transformer


def test_benchmark_smoke(tmp_path, capsys):
    bench = _load_benchmark()
    out = tmp_path / "bench.json"
    bench.main(["--models", "s2transformer_tiny", "so3vit_tiny", "--quick", "--no-memory", "--out", str(out)])
    result = json.loads(out.read_text())
    assert {r["model"] for r in result["rows"]} == {
        "s2transformer_tiny",
        "so3vit_tiny",
        "so3vit_tiny[posenc=none]",
        "so3vit_tiny[folded]",  # its inference form, eqvit.fold
        "timm_blocks:2x32,2h,240t",  # the no-overhead limit: the candidate's blocks alone
    }
    assert result["headline"]["reference"] == "s2transformer_tiny" and result["headline"]["candidate"] == "so3vit_tiny"
    assert result["headline"]["speedup"] > 0 and result["headline"]["rope_overhead"] > 0
    assert result["headline"]["over_bare"] > 0 and result["headline"]["bare_speedup"] > 0
    assert result["headline"]["folded"] == "so3vit_tiny[folded]"
    assert min(result["headline"][k] for k in ("folded_speedup", "folded_over_bare", "folded_rope_overhead")) > 0
    low, high = result["headline"]["folded_over_bare_paired_ci90"]  # how far the paired median can move
    assert low <= result["headline"]["folded_over_bare_paired_median"] <= high
    assert (
        len(result["forward_ms_raw"]["so3vit_tiny"]) == 3 and len(result["forward_ms_raw"]["s2transformer_tiny"]) == 2
    )
    assert result["machine"]["torch"] == torch.__version__ and result["machine"]["cpu_count"] >= 1
    printed = capsys.readouterr().out
    assert (
        "SO(3)-RoPE overhead" in printed
        and "inference form" in printed
        and "speed-up over s2transformer_tiny" in printed
    )
    assert "over the bare blocks" in printed and "so3vit_tiny[folded] over the bare blocks" in printed
    assert "90% interval" in printed
    # The memory measurement that the CLI runs in a fresh process, here in-process.
    mem = bench.memory_worker("so3vit_tiny", "cpu", batch=2, steps=1)
    assert mem["peak_mb"] >= mem["model_tensors_mb"] > 0 and len(mem["train_step_ms"]) == 1


def test_benchmark_times_the_compiled_inference_form_beside_the_compiled_bare_blocks(tmp_path, capsys):
    bench = _load_benchmark()
    out = tmp_path / "bench.json"
    argv = ["--models", "s2transformer_tiny", "so3vit_tiny", "--quick", "--no-memory", "--compile", "--out", str(out)]
    bench.main(argv)
    result = json.loads(out.read_text())
    compiled = ["so3vit_tiny[folded][compiled]", "timm_blocks:2x32,2h,240t[compiled]"]
    assert result["headline"]["compiled"] == compiled and result["settings"]["compile"]
    rows = {r["model"]: r for r in result["rows"]}
    assert all(rows[c]["forward_ms_median"] > 0 for c in compiled)
    assert rows[compiled[0]]["params"] == rows["so3vit_tiny[folded]"]["params"]  # counted on the model itself
    assert result["headline"]["compiled_over_bare"] > 0
    assert "compiled inference form over the compiled bare blocks" in capsys.readouterr().out


@pytest.mark.slow
def test_benchmark_cli_with_memory_subprocesses(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(BENCHMARK),
        "--models",
        "s2transformer_tiny",
        "so3vit_tiny",
        "--quick",
        "--threads",
        "1",
    ]
    cmd += ["--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    result = json.loads(out.read_text())
    rows = {r["model"]: r for r in result["rows"]}
    assert rows["s2transformer_tiny"]["train_peak_mb"] > 0 and rows["so3vit_tiny"]["memory_ratio"] > 0
    assert result["headline"]["memory_ratio"] > 0


def test_median_interval_brackets_the_median_and_narrows_with_more_rounds():
    import random

    from eqvit.bench.so3vit_vs_s2transformer import median_interval

    rng = random.Random(1)
    few = [1.05 + rng.gauss(0, 0.05) for _ in range(30)]
    many = [1.05 + rng.gauss(0, 0.05) for _ in range(300)]
    low, high = median_interval(few)
    assert low <= statistics.median(few) <= high and median_interval(few) == (low, high)  # seeded
    assert median_interval(many)[1] - median_interval(many)[0] < high - low
    assert median_interval([1.0, 1.0, 1.0]) == (1.0, 1.0) and median_interval([1.0]) is None


def test_s2transformer_deep_copy_shares_only_the_registered_kernel():
    # NeighborhoodAttentionS2.attention_handle is a torch CustomOpDef, which copy.deepcopy cannot copy.
    model = models.create_model("s2transformer_tiny")
    clone = copy.deepcopy(model)
    x = torch.randn(1, 3, 16, 32)
    assert torch.equal(model(x), clone(x))
    for (k, a), (_, b) in zip(model.state_dict().items(), clone.state_dict().items(), strict=True):
        assert torch.equal(a, b) and (a.data_ptr() != b.data_ptr() or a.numel() == 0), k
    attn, attn_clone = model.model.blocks[0].self_attn, clone.model.blocks[0].self_attn
    assert attn_clone.attention_handle is attn.attention_handle and attn_clone is not attn


def test_rotation_variants_compute_the_models_rotation():
    """The floor study times other forms of SO(3)-RoPE's rotation; each must rotate exactly as the model does."""
    bench = _load_benchmark()
    rope = models.create_model("so3vit_tiny").double().posenc
    qkv = torch.randn(2, rope.pi.shape[0], 3, 2, rope.head_dim, dtype=torch.float64)
    expected = qkv.clone()
    rope.rotate_qk_stacked_(expected[:, :, :2])
    variants = bench.rotation_variants(rope)
    assert {"all_orders", "per_order", "two_bands", "matmul_only"} <= set(variants)
    for name, rotate in variants.items():
        out = qkv.clone()
        rotate(out)
        if name == "matmul_only":  # writes nothing back
            assert torch.equal(out, qkv)
        else:
            assert (out - expected).abs().max() <= 1e-13, name


def test_profile_stages_times_every_stage():
    bench = _load_benchmark()
    stages = bench.profile_stages("so3vit_tiny", torch.device("cpu"), batch=1, repeats=1, warmup=0)
    assert {
        "forward",
        "forward_folded",
        "lifting",
        "lifting_folded",
        "head_folded",
        "blocks",
        "blocks_no_rope",
        "head",
        "wigner",
        "wigner_per_order",
    } <= set(stages)
    assert all(ms > 0 for ms in stages.values())
