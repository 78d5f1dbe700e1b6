"""The O(2) seed's protocol: its head layouts (Table 1), MLP G-sets by subgroup name (Sec. 5.3), and the
folder-driven experiments (Sec. 5.1 / 5.2 / 5.3 drivers) on a small generated image folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import ROOT

import eqvit
from eqvit.groups import get_group
from eqvit.models.o2vit import default_mlp_spaces, trivial_fraction
from eqvit.nn.irrep_attention import IrrepAttention, irrepwise_heads
from eqvit.nn.irrep_features import FeatureType
from eqvit.testing import EquivarianceError, assert_equivariant

TABLE1 = {"A": 1, "B": 1, "E1": 2}


def c4_model(q: int = 1, **kwargs):
    args = dict(group="C4", img_size=8, patch_size=4, depth=2, regular_copies=4 * q, num_classes=3)
    return eqvit.create_model("o2vit_square_s", **dict(args, **kwargs))


@pytest.mark.parametrize("q", [1, 2])
def test_table1_layouts_give_four_heads_of_4q_features(q):
    irrepwise = c4_model(q, attention="irrepwise", irrep_heads=TABLE1)
    coupled = c4_model(q, attention="coupled", num_heads=4)
    assert irrepwise.blocks[0].attn.head_dims == coupled.blocks[0].attn.head_dims == [4 * q] * 4
    heads = irrepwise.blocks[0].attn.heads
    ftype = irrepwise.token_type
    irrep_of = np.array([ftype.copies[c][0] for c in ftype.copy_index])
    # one head of A, one of B, two of E1 (Table 1), each holding copies of one irrep only
    assert [sorted({ftype.irreps[i].name for i in irrep_of[h]}) for h in heads] == [["A"], ["B"], ["E1"], ["E1"]]
    # the seed's "E" names the 2-d irrep E1 of C4
    assert (
        c4_model(q, attention="irrepwise", irrep_heads={"A": 1, "B": 1, "E": 2}).blocks[0].attn.head_dims == [4 * q] * 4
    )


def test_default_irrepwise_and_coupled_head_dims():
    assert c4_model(attention="irrepwise", num_heads=2).blocks[0].attn.head_dims == [2, 2, 2, 2, 4, 4]  # 2 per irrep
    m = eqvit.create_model("o2vit_square_tiny")  # D4, 3 coupled heads, 3 regular copies
    assert m.blocks[0].attn.head_dims == [8, 8, 8]


@pytest.mark.parametrize(
    ("irrep_heads", "message"),
    [
        ({"A": 1, "B": 1, "E1": 3}, r"E1: multiplicity 4, 3 heads"),
        ({"A": 1, "B": 1}, r"no head count for the irreps \['E1'\]"),
        ({"A": 1, "B": 1, "E1": 2, "A1": 1}, r"unknown irrep of C4 \(irrep_heads\) 'A1'.*Valid: A, B, E1"),
        ({"A": 0, "B": 1, "E1": 2}, r"irrep_heads\['A'\]: expected a number of heads >= 1"),
    ],
)
def test_irrep_heads_errors(irrep_heads, message):
    with pytest.raises(ValueError, match=message):
        c4_model(attention="irrepwise", irrep_heads=irrep_heads)


def test_irrep_heads_need_irrepwise_attention():
    with pytest.raises(ValueError, match="irrep_heads needs attention='irrepwise'"):
        c4_model(attention="coupled", irrep_heads=TABLE1)


def test_d6_irrep_heads_by_irrep():
    ftype = FeatureType.regular(get_group("D6"), 2)  # A1 A2 B1 B2 x2, E1 E2 x4
    heads = irrepwise_heads(ftype, {"A1": 1, "A2": 2, "B1": 1, "B2": 1, "E1": 4, "E2": 2})
    assert [len(h) for h in heads] == [2, 1, 1, 2, 2, 2, 2, 2, 2, 4, 4]


def test_mlp_spaces_by_subgroup_name():
    G = get_group("D4")
    spaces = default_mlp_spaces(G, [("C2", 2), ("D1", 1), ("regular", 1), ("D2[45deg]", 1)], 1)
    assert [(list(s) if not isinstance(s, str) else s, n) for s, n in spaces] == [
        ([0, 2], 2),
        ([0, 4], 1),
        ("regular", 1),
        ([0, 2, 5, 7], 1),
    ]
    # the seed's Sec. 5.3 G-sets: A1 fractions 1/8, 9/16, 3/8
    assert trivial_fraction(G, [("regular", 3)]) == 1 / 8
    assert trivial_fraction(G, [("regular", 3), ("trivial", 24)]) == 9 / 16
    assert trivial_fraction(G, [("C4", 2), ("D1", 2), ("D2[45deg]", 2)]) == 3 / 8
    model = eqvit.create_model("o2vit_square_tiny", mlp_spaces=[("C4", 1), ("D1", 1), ("D2[45deg]", 1)], num_classes=3)
    act = model.blocks[0].mlp.act
    assert act.in_type.multiplicities[0] == 3  # one A1 per orbit
    assert act.basis.shape[0] == 2 + 4 + 2  # |D4/C4| + |D4/D1| + |D4/D2'|


def test_mlp_spaces_unknown_name_lists_the_subgroups():
    with pytest.raises(ValueError, match=r"unknown subgroup of D4 \(mlp_spaces\) 'D3'.*Valid: regular, trivial, C1"):
        eqvit.create_model("o2vit_square_tiny", mlp_spaces=[("D3", 1)])
    with pytest.raises(ValueError, match="expected a count >= 0"):
        eqvit.create_model("o2vit_square_tiny", mlp_spaces=[("C2", -1)])


@pytest.mark.parametrize(
    "make",
    [
        lambda: c4_model(attention="irrepwise", irrep_heads=TABLE1),
        lambda: c4_model(attention="coupled", num_heads=4),
        lambda: eqvit.create_model(
            "o2vit_square_tiny", mlp_spaces=[("C2", 2), ("D1", 1), ("regular", 1)], num_classes=3
        ),
        lambda: eqvit.create_model(
            "o2vit_square_tiny", mlp_spaces=[("C4", 1), ("D1", 1), ("D2[45deg]", 1)], num_classes=3
        ),
        lambda: eqvit.create_model(
            "o2vit_hex_tiny",
            attention="irrepwise",
            regular_copies=2,
            irrep_heads={"A1": 1, "A2": 1, "B1": 2, "B2": 1, "E1": 2, "E2": 4},
            mlp_spaces=[("D3", 1), ("C2", 1), ("D1[30deg]", 1)],
        ),
    ],
    ids=["c4-irrepwise-table1", "c4-coupled-4heads", "d4-gset-C2-D1-regular", "d4-gset-sec5.3", "d6-irrep-heads"],
)
def test_new_layouts_are_invariant_in_float64(make):
    torch.manual_seed(0)
    report = assert_equivariant(make().eval(), dtype=torch.float64)
    assert report.max_relative_error < 1e-10


def test_a_head_that_splits_an_irrep_copy_is_refused_and_would_break_equivariance():
    ftype = FeatureType.regular(get_group("C4"), 1)  # A, B, E1 (coordinates 2, 3)
    with pytest.raises(ValueError, match="whole irrep copies"):
        IrrepAttention(ftype, [np.array([0, 1, 2]), np.array([3])])
    # bypass the check: the split E1 copy makes the layer non-equivariant, and the checker sees it
    attn = IrrepAttention(ftype, [np.array([0, 1, 2, 3])], attn_drop=0.0)
    attn.heads = [np.array([0, 1, 2]), np.array([3])]
    attn.head_groups = [(0, 1, 3), (3, 1, 1)]
    with pytest.raises(EquivarianceError):
        assert_equivariant(attn.eval(), dtype=torch.float64)


# ---------------------------------------------------------------------------------------- the drivers


@pytest.fixture
def image_folder(tmp_path):
    """Random RGB images in three class sub-folders (6 each), of odd sizes and formats."""
    from PIL import Image

    rng = np.random.default_rng(0)
    root = tmp_path / "scenes"
    for c, name in enumerate(["beach", "forest", "runway"]):
        (root / name).mkdir(parents=True)
        for i in range(6):
            pixels = (rng.random((24 + i, 20, 3)) * 255).astype(np.uint8)
            pixels[..., c] = 230  # a class colour, so that something can be learnt
            Image.fromarray(pixels).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def test_data_efficiency_plan_on_a_folder_is_the_seed_protocol(image_folder, capsys):
    from eqvit.bench.o2_data_efficiency import main

    main(["--image-folder", str(image_folder), "--plan", "--seeds", "0", "--targets", "20000"])
    plan = json.loads(capsys.readouterr().out)
    assert plan["tune"] is False
    assert plan["settings"]["geometry"] == {"img_size": 256, "hex_grid": [9, 9], "in_chans": 3, "num_classes": 3}
    runs = plan["runs"]
    assert {(r["ratio"], r["epochs"], r["patience"]) for r in runs} == {(0.1, 600, 60), (0.4, 150, 50), (1.0, 50, 10)}
    assert sorted({(r["grid"], r["group"]) for r in runs}) == sorted(
        [("square", g) for g in ("D4", "C4", "D2", "C1")] + [("hex", g) for g in ("D6", "C6", "D3", "C1")]
    )
    assert {r["patch_size"] for r in runs if r["grid"] == "square"} == {16} and {r["lr"] for r in runs} == {1e-3}
    assert len(runs) == 8 * 3


def test_seed_resolution_inputs_from_a_folder(image_folder):
    """RGB in [-1, 1] at 256^2; the hexagonal (9, 9) grid's 42,073 points by bilinear resampling."""
    from eqvit.data.images import ImageFolderDataset, image_folder_split
    from eqvit.geometry import HexPatchGrid
    from eqvit.nn.tokenizers.hexagonal import SquareToHex

    train, val, classes = image_folder_split(image_folder)
    assert classes == ["beach", "forest", "runway"] and len(val) == 3 * round(0.2 * 6)
    square, _ = ImageFolderDataset(train[:1], 256)[0]
    assert square.shape == (3, 256, 256) and square.min() >= -1 and square.max() <= 1
    assert square.min() < -0.5 and square.max() > 0.5
    grid = HexPatchGrid(9, 9)
    hexa, _ = ImageFolderDataset(train[:1], 256, SquareToHex(256, grid.points))[0]
    assert grid.num_points == 42_073 and hexa.shape == (3, 42_073)
    assert hexa.min() >= -1 and hexa.max() <= 1


def test_data_efficiency_runs_on_a_generated_folder(image_folder, tmp_path, capsys):
    from eqvit.bench.o2_data_efficiency import main

    out = tmp_path / "out"
    args = ["--image-folder", str(image_folder), "--smoke", "--groups", "D4", "D6", "--ratios", "0.5", "1.0"]
    main([*args, "--epochs", "3", "--patience", "1", "--jobs", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert "square" in text and "hex" in text
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert {(r["grid"], r["group"], r["ratio"]) for r in runs} == {
        (g, G, r) for g, G in (("square", "D4"), ("hex", "D6")) for r in (0.5, 1.0)
    }
    for r in runs:
        assert r["geometry"] == {"img_size": 32, "hex_grid": [2, 4], "in_chans": 3, "num_classes": 3}
        # per class: round(0.2 * 6) = 1 validation image, 5 training ones; ratio 0.5 keeps round(7.5) = 8 of 15
        assert r["train_size"] == (8 if r["ratio"] == 0.5 else 15) and r["val_size"] == 3
        assert 1 <= r["best_epoch"] <= r["epochs_run"] <= 3 and 0 <= r["accuracy"] <= 1
        assert r["stopped_early"] == (r["epochs_run"] < 3)
        run_dir = out / "runs" / f"{r['grid']}-{r['group']}-r{r['ratio']:g}-t5000-p{r['patch_size']}-lr0.001-seed0"
        assert (run_dir / "best.safetensors").is_file() and (run_dir / "metrics.json").is_file()
    assert (out / "summary.json").is_file() and (out / "accuracy_vs_params.png").is_file()


def test_data_efficiency_folder_user_errors(image_folder, tmp_path, capsys):
    from eqvit.bench.o2_data_efficiency import main

    for argv, message in [
        (["--image-folder", str(tmp_path / "none"), "--plan"], "expected a folder with one sub-folder"),
        (["--image-folder", str(image_folder), "--lrs", "1e-3", "3e-3", "--plan"], "runs at one setting"),
        (["--image-folder", str(image_folder), "--img-size", "30", "--plan"], "do not divide --img-size 30"),
        (["--img-size", "64", "--plan"], "set the --image-folder geometry"),
    ]:
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2 and message in capsys.readouterr().err


def test_attention_ablation_cells_on_a_generated_folder(image_folder, tmp_path):
    from eqvit.bench import ablate

    rows = []
    for layout in ablate.ATTENTION_LAYOUTS:
        cell = dict(
            dataset="folder", layout=layout, q=1, ratio=1.0, seed=0, depth=1, epochs=2, patience=1, threads=1,
            num_classes=3, image_folder=str(image_folder), img_size=16, patch_size=8, device="cpu",
            out=str(tmp_path / "runs" / layout),
        )  # fmt: skip
        rows.append(ablate.train_attention_cell(cell))
    coupled, irrepwise = rows
    assert coupled["head_dims"] == irrepwise["head_dims"] == [4, 4, 4, 4]  # Table 1, q = 1
    assert coupled["params"] == irrepwise["params"]  # the same linears, another head partition
    report = ablate.attention_report(rows, tmp_path, None)
    assert "| folder | 1 | 1 | irrep-wise | [4, 4, 4, 4] |" in report["table"]
    assert (tmp_path / "attention_folder.png").is_file()


def test_o2_gsets_quick(tmp_path, capsys):
    from eqvit.bench.o2_gsets import main

    main(["--quick", "--jobs", "1", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    fractions = {r["gset"]: r["a1_fraction"] for r in results["summary"]}
    assert fractions == {"D4": 1 / 8, "D4 + 8 pts": 9 / 16, "D4/C4 + D4/D1 + D4/D2'": 3 / 8}
    hidden = {r["gset"]: r["hidden_dim"] for r in results["summary"]}
    assert hidden == {"D4": 24, "D4 + 8 pts": 48, "D4/C4 + D4/D1 + D4/D2'": 24}  # n = 3: 3 x 8, 3 x 16, 3 x 8
    assert all(0 <= r["accuracy"] <= 1 and len(r["loadavg"]) == 3 for r in results["runs"])
    assert (tmp_path / "results.md").is_file() and (tmp_path / "accuracy_vs_a1_fraction.png").is_file()


def test_hex_patternnet_config_trains_on_a_folder_with_early_stopping(image_folder, tmp_path):
    """The shipped hexagonal config, shrunk (grid, depth, image side), on the generated folder via `train`."""
    from eqvit.train.config import load_config
    from eqvit.train.engine import train

    root = ROOT
    cfg = load_config(root / "configs" / "o2vit_hex_patternnet.yaml")
    kwargs = cfg.model.kwargs
    assert (kwargs["n_patch_side"], kwargs["n_pixel_side"], kwargs["img_size"], cfg.data.img_size) == (9, 9, 256, 256)
    assert (cfg.train.patience, cfg.train.monitor, cfg.train.max_epochs) == (10, "accuracy", 50)
    cfg.model.kwargs.update(n_patch_side=2, n_pixel_side=4, depth=1, num_classes=3, img_size=16)
    cfg.data.root, cfg.data.img_size, cfg.data.batch_size = str(image_folder), 16, 4
    cfg.train.max_epochs, cfg.train.patience, cfg.train.out = 4, 1, str(tmp_path / "run")
    summary = train(cfg, progress=False)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["best_step"] == summary["best_step"] and metrics["stopped_early"] == summary["stopped_early"]
    assert metrics["stopped_early"] == (metrics["steps"] < 4 * 4)  # 15 training images, batch 4: 4 steps / epoch
    assert (tmp_path / "run" / "best.safetensors").is_file() and (tmp_path / "run" / "last.safetensors").is_file()
