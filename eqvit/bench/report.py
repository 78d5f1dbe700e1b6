"""``docs/benchmarks.md`` from the canonical result files: one table per benchmark, with its command, machine,
date and load.

Every benchmark under ``benchmarks/`` writes one canonical JSON (and a plot) under ``benchmarks/results/``;
this script reads them and writes the page, so the page says what the files say. ``--check`` compares
instead of writing (the test suite runs it: a result changed without the page fails).

Usage: ``python benchmarks/report.py [--check] [--out docs/benchmarks.md]`` (also ``eqvit bench report``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eqvit.bench._paths import results_dir

Lines = list[str]


# ------------------------------------------------------------------------------------------------ helpers


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats to ``digits`` significant digits, None as a dash, lists joined."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "nan"
        if value != 0 and (abs(value) < 10 ** -(digits - 1) or abs(value) >= 10**6):
            return f"{value:.{max(digits - 1, 1)}e}"
        return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v, digits) for v in value)
    return str(value)


def table(rows: Iterable[dict[str, Any]], columns: Sequence[tuple[str, str | Callable[[dict], Any]]]) -> Lines:
    """A markdown table: ``columns`` are ``(header, key or function of the row)``."""
    head = "| " + " | ".join(h for h, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = [
        "| " + " | ".join(fmt(get(row) if callable(get) else row.get(get)) for _, get in columns) + " |" for row in rows
    ]
    return [head, rule, *body]


def find(data: Any, keys: tuple[str, ...]) -> list[Any]:
    """Every value stored under one of ``keys`` anywhere in ``data`` (depth first)."""
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key in keys:
                found.append(value)
            else:
                found += find(value, keys)
    elif isinstance(data, list):
        for item in data:
            found += find(item, keys)
    return found


def load_range(data: Any) -> str:
    """The 1-minute load averages recorded in a result, as ``min-max`` (or a dash)."""
    values = []
    for value in find(
        data,
        (
            "load",
            "loadavg",
            "load_avg_1min",
            "loadavg_1m",
            "load_avg",
            "loadavg_start",
            "loadavg_end",
            "load_avg_start",
            "load_avg_end",
            "load_avg_1min_per_round",
            "load_avg_1min_train",
            "load_avg_1min_sample",
        ),
    ):
        if isinstance(value, dict):  # a summary such as {"mean": ..., "max": ...}
            value = list(value.values())
        for item in value if isinstance(value, list) else [value]:
            number = item[0] if isinstance(item, list) and item else item
            if isinstance(number, (int, float)) and not isinstance(number, bool):
                values.append(float(number))
    if not values:
        return "not recorded"
    low, high = min(values), max(values)
    return f"{low:.1f}" if high - low < 0.05 else f"{low:.1f}-{high:.1f}"


def machine_of(data: Any) -> str:
    """What the result says about the machine: torch version and platform or processor, and threads."""
    parts = []
    for keys in (("torch",), ("platform", "machine"), ("threads", "torch_threads")):
        found = [v for v in find(data, keys) if isinstance(v, (str, int)) and not isinstance(v, bool)]
        if found:
            parts.append(f"{keys[0]} {found[0]}")
    return "; ".join(parts) if parts else "not recorded"


def committed_date(path: Path) -> str:
    """The date of the last commit of ``path`` (``YYYY-MM-DD``), or ``uncommitted``."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", str(path)],
            cwd=path.parent,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        out = ""
    return out or "uncommitted"


# ------------------------------------------------------------------------------------------------ sections


@dataclass(frozen=True)
class Section:
    """One benchmark: its title, result file (under ``benchmarks/results``), command, what it measures and the
    table of its result."""

    title: str
    path: str
    command: str
    about: str
    render: Callable[[dict], Lines]
    plot: str | None = None


def _scale_speed(d: dict) -> Lines:
    lines = []
    for size, r in d["sizes"].items():
        names = list(r["info"])
        rows = [
            dict(measure="params (M)", **{n: r["info"][n]["params"] / 1e6 for n in names}),
            dict(measure="FLOPs / timm", **{n: r["info"][n]["flops_ratio"] for n in names}),
        ]
        for f in r["forward"]:
            label = f"inference b{f['batch']}, {f['threads']} thread{'s' * (f['threads'] > 1)} (x timm)"
            rows.append(dict(measure=label, **{n: f["models"][n]["ratio"] for n in names}))
        if r.get("training"):
            t = r["training"]["models"]
            label = f"training step b8, {d['meta']['train_rounds']} rounds (x timm)"
            rows.append(dict(measure=label, **{n: t[n]["ratio"] for n in names}))
            rows.append(dict(measure="training memory (x timm)", **{n: t[n]["training_memory_ratio"] for n in names}))
            compiled = r["training"].get("compiled")
            if compiled:
                c = compiled["models"]
                rows.append(
                    dict(
                        measure="training step b8, torch.compile (x compiled timm)",
                        **{n: c[n].get("ratio", "did not compile") for n in names},
                    )
                )
                first = {n: c[n].get("first_call_s", "") for n in names}
                rows.append(dict(measure="compile + first step, cold caches (s)", **first))
        lines += [f"ViT-{size[0].upper()}/16:", "", *table(rows, [("", "measure"), *[(n, n) for n in names]]), ""]
    return lines


def _so3vit_vs_s2(d: dict) -> Lines:
    cols = [
        ("model", "model"),
        ("params", "params"),
        ("tokens", "tokens"),
        ("forward ms", "forward_ms_median"),
        ("speed-up over S2Transformer 4x128", "speed_ratio"),
    ]
    h = d["headline"]
    ratios = [
        dict(
            ratio=f"{h['candidate']} / {h['reference']} speed-up",
            training=h["speedup_paired_median"],
            inference=h["folded_speedup_paired_median"],
        ),
        dict(
            ratio=f"{h['candidate']} over the bare timm blocks",
            training=h["over_bare_paired_median"],
            inference=h["folded_over_bare_paired_median"],
        ),
        dict(
            ratio="SO(3)-RoPE over no RoPE",
            training=h["rope_overhead_paired_median"],
            inference=h["folded_rope_overhead_paired_median"],
        ),
    ]
    if h.get("compiled"):
        ratios.append(
            dict(
                ratio="torch.compile: over the compiled bare timm blocks",
                training="-",
                inference=h["compiled_over_bare_paired_median"],
            )
        )
    columns = [("paired median ratio", "ratio"), ("training form", "training"), ("inference form", "inference")]
    return [*table(d["rows"], cols), "", *table(ratios, columns)]


def _o2_speed(d: dict) -> Lines:
    rows = []
    for r in d["rows"]:
        for name, m in r["models"].items():
            rows.append(dict(batch=r["batch"], model=name, ms=m["forward_ms_median"], ratio=m["ratio_to_timm"]))
    return table(rows, [("batch", "batch"), ("model", "model"), ("forward ms", "ms"), ("x timm", "ratio")])


def _platonic_speed(d: dict) -> Lines:
    cols = [
        ("case", "case"),
        ("batch", "batch"),
        ("|G|", "group_order"),
        ("tokens", "tokens"),
        ("ours ms", lambda r: 1e3 * r["ours_s"]),
        ("timm ms", lambda r: 1e3 * r["timm_s"]),
        ("ours / timm", "ratio_median"),
    ]
    return table(d["models"], cols)


def _compile(d: dict) -> Lines:
    cols = [
        ("model", "name"),
        ("form", "form"),
        ("graph breaks", "graph_breaks"),
        ("first call s", "first_call_s"),
        ("eager ms", "eager_ms"),
        ("compiled ms", "compiled_ms"),
        ("compiled / eager", "compiled_over_eager"),
        ("max diff", "max_abs_diff"),
    ]
    return table(d["rows"], cols)


def _fold_agreement(d: dict) -> Lines:
    cols = [("model", "model"), ("dtype", "dtype"), ("relative error", "relative_error")]
    return table(d["rows"], cols)


def _o2_equivariance(d: dict) -> Lines:
    inv = table(
        d["invariance"],
        [
            ("grid", "grid"),
            ("group", "group"),
            ("attention", "attention"),
            ("elements", "elements"),
            ("max relative error", "max_relative_error"),
        ],
    )
    res = table(
        d["restriction"],
        [
            ("grid", "grid"),
            ("G", "group"),
            ("H", "subgroup"),
            ("attention", "attention"),
            ("logits vs G-model", "logits_relative_error"),
            ("H-invariance", "subgroup_invariance_error"),
        ],
    )
    return ["Invariance (float64, noised parameters):", "", *inv, "", "Restriction to subgroups:", "", *res]


def _groups_timing(d: dict) -> Lines:
    rows = [dict(work=k, best=min(v), median=sorted(v)[len(v) // 2]) for k, v in d["seconds"].items()]
    return table(rows, [("construction", "work"), ("best s", "best"), ("median s", "median")])


def _import_time(d: dict) -> Lines:
    cols = [("case", "case"), ("median s", "median_s"), ("x import torch, timm", "median_ratio_vs_torch_timm")]
    return table(d["rows"], cols)


def _wigner(d: dict) -> Lines:
    return table(d["results"], [("what", "name"), ("median ms", "median_ms"), ("us per pose", "us_per_pose")])


def _swe_accuracy(d: dict) -> Lines:
    rows = [
        {**v, "model": k, **{f"m_{key}": val for key, val in v.get("metrics", {}).items()}}
        for k, v in d["results"].items()
    ]
    cols = [
        ("model", "model"),
        ("params", "params"),
        ("steps", "steps"),
        ("rel L2", "m_rel_l2"),
        ("rel L1", "m_rel_l1"),
        ("beats persistence", "beats_persistence"),
    ]
    return table(rows, cols)


def _swe_rollout(d: dict) -> Lines:
    cols = [
        ("lead h", "lead_hours"),
        ("rel L2", "rel_l2"),
        ("persistence rel L2", "persistence_rel_l2"),
        ("rel L1", "rel_l1"),
        ("persistence rel L1", "persistence_rel_l1"),
    ]
    return [f"{d['model']}, {d['num_initial_conditions']} validation initial conditions:", "", *table(d["steps"], cols)]


def _swe_table1(d: list) -> Lines:
    for r in d:
        r["row"] = r["model"] + (f"-{r['variant']}" if r.get("variant") else "")
    cols = [
        ("row", "row"),
        ("settings", lambda r: ", ".join(r.get("settings", [])) or "the config's"),
        ("params", "params"),
        ("seed params", lambda r: f"{r['seed_params_m']:.2f}M"),
        ("epochs", "epochs"),
        ("seed l1", "seed_l1"),
        ("seed l2", "seed_l2"),
        ("l1", "l1"),
        ("l2", "l2"),
        ("rel L1", "rel_l1"),
        ("rel L2", "rel_l2"),
        ("persistence l2", "persistence_l2"),
        ("s / epoch", "seconds_per_epoch"),
        ("wall min", lambda r: r["wall_s"] / 60),
        ("threads", "threads"),
    ]
    maps = [
        f"![{r['row']}: loss curve](../benchmarks/results/swe_table1/{r['row']}/loss_curve.png)"
        f" ![{r['row']}: error map](../benchmarks/results/swe_table1/{r['row']}/error_map.png)"
        for r in d
    ]
    return [*table(d, cols), "", *maps]


def _swe_probes(d: list) -> Lines:
    cols = [
        ("probe", "name"),
        ("settings", lambda r: ", ".join(r["settings"]) or "(the row's config)"),
        ("steps", "steps"),
        ("train loss, last 50", "train_loss_last_50"),
        ("l1", "l1"),
        ("l2", "l2"),
        ("rel L2", "rel_l2"),
        ("wall min", lambda r: r["wall_s"] / 60),
    ]
    return table(d, cols)


def _swe_rollout_leads(d: dict) -> Lines:
    leads = {1, 2, 4, 8, 12, 16, 24, d["num_steps"]}
    cols = [
        ("lead h", "lead_hours"),
        ("rel L2", "rel_l2"),
        ("persistence rel L2", "persistence_rel_l2"),
        ("l2", "l2"),
        ("persistence l2", "persistence_l2"),
        ("rel L1", "rel_l1"),
        ("persistence rel L1", "persistence_rel_l1"),
    ]
    steps = [s for s in d["steps"] if s["step"] in leads]
    below = all(s["rel_l2"] is not None and s["rel_l2"] < s["persistence_rel_l2"] for s in d["steps"])
    return [
        f"{d['model']} (`{d['checkpoint']}`), {d['num_initial_conditions']} validation initial conditions; below "
        f"persistence in rel L2 at every lead 1-{d['num_steps']} h: {fmt(below)}.",
        "",
        *table(steps, cols),
    ]


def _dip_qm9(d: list) -> Lines:
    percent = ("atom_stability", "molecule_stability", "validity", "uniqueness", "valid_and_unique", "novelty")
    cols = [("frames", "frames"), ("params", "params"), ("steps", "steps"), ("epochs", "epochs")]
    cols += [(key.replace("_", " "), key) for key in (*percent, "pb_all")]
    cols += [("train min", lambda r: r["train_s"] / 60 if "train_s" in r else None), ("samples", "num_molecules")]
    return table(d, cols)


def _kill_resume(d: dict) -> Lines:
    rows = [
        {**r, "signal": name, "exit_codes": ", ".join(f"{c} x{n}" for c, n in r["exit_codes"].items())}
        for name, r in d["by_signal"].items()
    ]
    cols = [
        ("signal", "signal"),
        ("tries", "tries"),
        ("exact", "exact"),
        ("exit codes", "exit_codes"),
        ("a checkpoint before the resume", "checkpoint_before_resume"),
    ]
    stops = d["stops"]
    return [
        f"{d['exact']} of {d['tries']} tries exact; {stops['before_any_checkpoint']} stops came before any "
        f"checkpoint, {stops['inside_a_checkpoint_write']} inside a checkpoint write, and "
        f"{stops['resume_stopped_too']} tries had their first resume stopped too.",
        "",
        *table(rows, cols),
    ]


def _so3vit_sweep(d: dict) -> Lines:
    cols = [
        ("cell", "label"),
        ("params", "params"),
        ("s / step", "seconds_per_step"),
        ("rel L2", "rel_l2"),
        ("rel L1", "rel_l1"),
    ]
    return [
        *table(d["rows"], cols),
        "",
        f"Pareto front: {', '.join(d['pareto_front'])}; persistence rel L2 {fmt(d['persistence_rel_l2'])}.",
    ]


def _o2_data_efficiency(d: dict) -> Lines:
    cols = [
        ("grid", "grid"),
        ("group", "group"),
        ("ratio", "ratio"),
        ("params", "params"),
        ("accuracy", "accuracy_mean"),
        ("std", "accuracy_std"),
        ("seeds", lambda r: len(r["seeds"])),
    ]
    return table(d["summary"], cols)


def _o2_gsets(d: dict) -> Lines:
    cols = [
        ("MLP G-set", "gset"),
        ("q", "q"),
        ("A1 fraction", "a1_fraction"),
        ("params", "params"),
        ("accuracy", "accuracy_mean"),
        ("std", "accuracy_std"),
    ]
    return table(d["summary"], cols)


def _by_group(summary: dict) -> Lines:
    rows = [dict(frames=k, **v) for k, v in summary.items()]
    cols = [
        ("frames", "frames"),
        ("params", "params"),
        ("test, SO(3)-rotated", "test_so3_mean"),
        ("std", "test_so3_std"),
        ("test, upright", "test_none_mean"),
        ("train s", "train_s_mean"),
    ]
    return table(rows, cols)


def _ablate_images(d: dict) -> Lines:
    cols = [
        ("dataset", "dataset"),
        ("model", "label"),
        ("ratio", "ratio"),
        ("params", "params"),
        ("accuracy", "mean"),
        ("std", "std"),
        ("seeds", "seeds"),
    ]
    return table(d["summary"], cols)


def _ablate_swe(d: dict) -> Lines:
    cols = [
        ("model", "label"),
        ("params", "params"),
        ("steps", "steps"),
        ("s / step", "seconds_per_step"),
        ("rel L2", "rel_l2"),
        ("rel L1", "rel_l1"),
        ("polar ratio", "polar_error_ratio"),
    ]
    return [*table(d["rows"], cols), "", f"Persistence rel L2 {fmt(d['persistence']['rel_l2'])}."]


def _platonic_head_fit(d: dict) -> Lines:
    cols = [("model", "model"), ("first loss", "loss_first"), ("last loss", "loss_last"), ("s / step", "s_per_step")]
    return table(d["rows"], cols)


def _qm9(d: dict) -> Lines:
    rows = []
    for r in d["records"]:
        test = r["test_mae"]
        rows.append(
            dict(
                model=r["model"],
                seed=r["seed"],
                params=r["params"],
                epochs=r["epochs"],
                **{f"mae {k}": v for k, v in test.items()},
            )
        )
    targets = sorted({k for r in rows for k in r if k.startswith("mae ")})
    cols = [("model", "model"), ("seed", "seed"), ("params", "params"), ("epochs", "epochs")]
    return table(rows, cols + [(f"test {k}", k) for k in targets])


def _rows(keys: Sequence[tuple[str, str]]) -> Callable[[Any], Lines]:
    """A table of a result that is a list of rows (or has ``rows``)."""

    def render(d: Any) -> Lines:
        return table(d if isinstance(d, list) else d["rows"], keys)

    return render


SECTIONS = (
    Section(
        "ViT-S/B scale: timm, the D4 models, octic-vits",
        "scale_speed.json",
        "python benchmarks/scale_speed.py --compile-train",
        "Inference (eqvit.fold; batches 1 and 8, 1 and 2 threads, 7 rounds) and training step (forward, backward, "
        "AdamW; batch 8; training form; 1 thread) as ratios to timm's vit_small/base_patch16_224 in "
        "interleaved rounds; training memory is the whole iteration's peak of tensor memory. The D4 models' "
        "batch-8 forwards move with glibc's heap state (page faults on freshly mapped memory for their "
        "hidden-sized tensors, which depend on what ran before in the process): timed alone, or with "
        "MALLOC_MMAP_THRESHOLD_=33554432, the ViT-S row is lower than in a full run.",
        _scale_speed,
    ),
    Section(
        "SO3ViT against torch-harmonics' S2Transformer",
        "so3vit_vs_s2transformer.json",
        "python benchmarks/so3vit_vs_s2transformer.py --threads 1 --batches 1 --repeats 40 --no-memory --compile",
        "Forward time per model, interleaved; the bare timm blocks on the same tokens; SO(3)-RoPE against none.",
        _so3vit_vs_s2,
    ),
    Section(
        "O(2) models at the seed's width",
        "o2_speed.json",
        "python benchmarks/o2_speed.py --batches 1 16 --threads 1 --repeats 30 --compile",
        "o2vit_square_s (D4, width 48) against a timm ViT of the same width and tokens, inference forms; a "
        "[compiled] row is under torch.compile(fullgraph=True), against compiled timm.",
        _o2_speed,
    ),
    Section(
        "Platonic Transformers against timm at equal width",
        "platonic_speed.json",
        "python benchmarks/platonic_speed.py --threads 1",
        "Each Platonic model against a timm ViT of the same total width, tokens, depth and heads.",
        _platonic_speed,
    ),
    Section(
        "torch.compile",
        "compile.json",
        "python benchmarks/compile.py",
        "torch.compile(model, fullgraph=True) with Inductor against eager, per family and form.",
        _compile,
    ),
    Section(
        "Export: torch.export and ONNX",
        "export.json",
        "python benchmarks/export.py",
        "One model per family in both forms: torch.export with a free batch size and ONNX in onnxruntime, "
        "relative difference from eager PyTorch at another batch size than the one exported.",
        _rows(
            [
                ("model", "model"),
                ("form", "form"),
                ("torch.export rel err", "export_rel_err"),
                ("export s", "export_seconds"),
                ("onnxruntime rel err", "onnx_rel_err"),
                ("ONNX s", "onnx_seconds"),
            ]
        ),
    ),
    Section(
        "Stop signals and resume: the kill -9 / SIGINT / SIGTERM campaign",
        "kill_resume.json",
        "python benchmarks/kill_resume.py --tries 30",
        "A real eqvit train (so3vit_tiny, 16 steps, a checkpoint every 2) stopped at seeded random moments or "
        "inside a checkpoint write, resumed with --resume until complete, compared bit for bit (losses and "
        "every model and optimiser tensor) with an uninterrupted run.",
        _kill_resume,
    ),
    Section(
        "Inference form agreement",
        "fold_agreement.json",
        "python benchmarks/fold_agreement.py",
        "eqvit.fold(model) against the training form, every registered model.",
        _fold_agreement,
    ),
    Section(
        "O(2) equivariance and restriction",
        "o2_equivariance.json",
        "python benchmarks/o2_equivariance.py",
        "Every group of both lattices and both attention layouts; restriction computes the same function.",
        _o2_equivariance,
    ),
    Section(
        "Group construction",
        "groups_timing.json",
        "python benchmarks/groups_timing.py",
        "Building the Platonic groups with their irreps.",
        _groups_timing,
    ),
    Section(
        "Import time",
        "import_time.json",
        "python benchmarks/import_time.py",
        "`import eqvit` and `eqvit list` against `import torch, timm`.",
        _import_time,
    ),
    Section(
        "Wigner-D matrices",
        "wigner_timing.json",
        "python benchmarks/wigner_timing.py",
        "Batched real Wigner-D matrices of random rotations.",
        _wigner,
    ),
    Section(
        "Shallow water: SO3ViT, the learned-APE ViT, S2Transformer",
        "swe_accuracy/swe_accuracy.json",
        "python benchmarks/swe_accuracy.py",
        "The same training time per model, scored on the validation states.",
        _swe_accuracy,
        plot="swe_accuracy/so3vit_4x128/error_map.png",
    ),
    Section(
        "Shallow water: rollout of the main job's model",
        "swe_rollout/rollout.json",
        "eqvit eval configs/so3vit_swe_demo.yaml --checkpoint runs/so3vit_swe_demo/best.safetensors --rollout 16 "
        "--out benchmarks/results/swe_rollout",
        "Autoregressive rollout against persistence (predicting the input).",
        _swe_rollout,
        plot="swe_rollout/rollout.png",
    ),
    Section(
        "Shallow water: the SO(3)-RoPE seed's Table 1 at its budget",
        "swe_table1.json",
        "python benchmarks/swe_table1.py --rows so3vit_4x128 (so3vit_4x256 with --max-minutes 170; the lr3e-3 row with "
        "--variant lr3e-3 --set optim.lr=3e-3)",
        "The seed's protocol (its Sec. 4.1): 100 epochs of 256 fresh simulations at batch 16 (1,600 Adam steps, "
        "cosine schedule), scored after the last step on 50 validation simulations. l1 / l2 are the seed's "
        "metrics (torch-harmonics' L1LossS2 / L2LossS2: the spherical mean absolute and root-mean-square error of "
        "the normalised fields); rel L1 / rel L2 divide by the same norms of the target. docs/shallow_water.md "
        "relates them and lists where the data and metrics depart from the seed's.",
        _swe_table1,
    ),
    Section(
        "Shallow water: short probes of the gap to the seed's Table 1",
        "swe_table1/probes.json",
        "python benchmarks/swe_table1.py --probe NAME --steps 150 --set SECTION.KEY=VALUE",
        "so3vit_4x128 on the Table 1 config for 150 steps (a cosine schedule over those steps) with one setting "
        "changed, scored on the same 50 validation simulations.",
        _swe_probes,
    ),
    Section(
        "Shallow water: 24-hour rollout of the Table 1 model (one-step training)",
        "swe_multistep/one_step/rollout.json",
        "eqvit eval configs/so3vit_swe_table1_4x128.yaml --checkpoint runs/swe_table1/so3vit_4x128-lr3e-3/"
        "last.safetensors --rollout 24 --out benchmarks/results/swe_multistep/one_step",
        "The Table 1 row so3vit_4x128-lr3e-3 (trained at lr 3e-3), rolled out autoregressively against persistence "
        "(predicting the input).",
        _swe_rollout_leads,
    ),
    Section(
        "Shallow water: 24-hour rollout after multi-step fine-tuning",
        "swe_multistep/rollout.json",
        "eqvit train configs/so3vit_swe_multistep_4x128.yaml, then eqvit eval "
        "configs/so3vit_swe_multistep_4x128.yaml --checkpoint runs/swe_multistep/so3vit_4x128/last.safetensors "
        "--rollout 24 --out benchmarks/results/swe_multistep",
        "The model above fine-tuned on the loss over K autoregressive hours (train.rollout_steps, "
        "train.rollout_schedule: K = 2, 4, 6; 400 steps at lr 2e-4), hour k weighted 0.5^(k-1) "
        "(train.rollout_discount), then rolled out as above.",
        _swe_rollout_leads,
        plot="swe_multistep/rollout.png",
    ),
    Section(
        "Shallow water: multi-step fine-tuning of the lr 1e-3 Table 1 model: one-step rollout",
        "swe_multistep/lr1e-3_base/one_step/rollout.json",
        "eqvit eval configs/so3vit_swe_table1_4x128.yaml --checkpoint runs/swe_table1/so3vit_4x128/last.safetensors "
        "--rollout 24 --out benchmarks/results/swe_multistep/lr1e-3_base/one_step",
        "The first base of the fine-tunes: the Table 1 row so3vit_4x128 (lr 1e-3), whose rollout leaves "
        "persistence behind between 4 and 8 hours. This and the three sections after it are the runs that chose "
        "the discount.",
        _swe_rollout_leads,
    ),
    Section(
        "Shallow water: multi-step fine-tuning of the lr 1e-3 Table 1 model: discount 0.5",
        "swe_multistep/lr1e-3_base/rollout.json",
        "eqvit train configs/so3vit_swe_multistep_4x128.yaml with model.kwargs.checkpoint_path: "
        "runs/swe_table1/so3vit_4x128/last.safetensors and train.out: runs/swe_multistep_lr1e-3base/so3vit_4x128, "
        "then eqvit eval on its last.safetensors --rollout 24 --out benchmarks/results/swe_multistep/lr1e-3_base",
        "The multi-step config's fine-tune (K = 2, 4, 6; hour k weighted 0.5^(k-1); lr 2e-4) from the lr 1e-3 "
        "model: below persistence at every lead, by little at 24 hours, with a first-hour error 27 % above its base's.",
        _swe_rollout_leads,
    ),
    Section(
        "Shallow water: multi-step fine-tuning of the lr 1e-3 Table 1 model: equal weights",
        "swe_multistep/lr1e-3_base/discount1/rollout.json",
        "as above with train.rollout_discount: 1 and train.out: runs/swe_multistep_gamma1/so3vit_4x128, then "
        "eqvit eval on its last.safetensors --rollout 24 --out benchmarks/results/swe_multistep/lr1e-3_base/discount1",
        "The K hours weighted equally (the plain mean): the late hours' larger errors dominate the loss, and the "
        "first hour's error grows.",
        _swe_rollout_leads,
    ),
    Section(
        "Shallow water: multi-step fine-tuning of the lr 1e-3 Table 1 model: a quarter of the learning rate",
        "swe_multistep/lr1e-3_base/lr5e-5/rollout.json",
        "as the discount-0.5 run with optim.lr: 5.0e-5 and train.out: runs/swe_multistep_lr5e-5/so3vit_4x128, then "
        "eqvit eval on its last.safetensors --rollout 24 --out benchmarks/results/swe_multistep/lr1e-3_base/lr5e-5",
        "At 5e-5 instead of 2e-4: the first hour stays closer to the base's (0.124 against 0.131), and the "
        "rollout falls behind persistence between 12 and 16 hours.",
        _swe_rollout_leads,
    ),
    Section(
        "DiP: molecule generation on QM9 (the Platonic seed's Tables 3 and 4)",
        "dip_qm9.json",
        "python benchmarks/dip_qm9.py --runs runs/dip_qm9_bench60",
        "configs/dip_qm9.yaml's denoiser with trivial against tetrahedral frames at the same width, trained side by "
        "side for the same one-thread step time (60 minutes each, the default), then 1,000 molecules each (the "
        "same atom counts and noise seed) "
        "scored with EDM's atom and molecule stability, RDKit validity, uniqueness and novelty, and PoseBusters' "
        "molecule checks (pb all: every check passed). EDM's published figures (a GPU and 3,000 epochs) are "
        "context, not a comparison.",
        _dip_qm9,
        plot="dip_qm9_molecules.png",
    ),
    Section(
        "SO3ViT depth x heads x width sweep (CPU grid)",
        "so3vit_sweep/so3vit_sweep.json",
        "python benchmarks/so3vit_sweep.py --threads 1",
        "Accuracy against time per epoch.",
        _so3vit_sweep,
        plot="so3vit_sweep/pareto.png",
    ),
    Section(
        "O(2) seed: data efficiency on rotated MNIST",
        "o2_data_efficiency/summary.json",
        "python benchmarks/o2_data_efficiency.py",
        "Accuracy per group and training fraction.",
        _o2_data_efficiency,
        plot="o2_data_efficiency/accuracy_vs_params.png",
    ),
    Section(
        "O(2) seed: MLP G-sets",
        "o2_gsets/results.json",
        "python benchmarks/o2_gsets.py",
        "The homogeneous spaces of the Fourier MLP.",
        _o2_gsets,
        plot="o2_gsets/accuracy_vs_a1_fraction.png",
    ),
    Section(
        "Platonic point clouds",
        "platonic_pointcloud/results.json",
        "python benchmarks/platonic_pointcloud.py",
        "Synthetic shapes per frame group, tested on SO(3)-rotated and upright clouds.",
        lambda d: _by_group(d["summary"]),
        plot="platonic_pointcloud/accuracy.png",
    ),
    Section(
        "Platonic classifier heads",
        "platonic_head_fit.json",
        "python benchmarks/platonic_head_fit.py",
        "How fast each head fits a few digits.",
        _platonic_head_fit,
    ),
    Section(
        "QM9 properties",
        "qm9.json",
        "python benchmarks/qm9.py",
        "Test MAE per model at equal time.",
        _qm9,
        plot="qm9_curves.png",
    ),
    Section(
        "Ablation: image models",
        "ablate/images/results.json",
        "python benchmarks/ablate.py images",
        "Rotated MNIST across families and groups.",
        _ablate_images,
        plot="ablate/images/accuracy_vs_params_rotated_mnist.png",
    ),
    Section(
        "Ablation: point-cloud frames",
        "ablate/points/results.json",
        "python benchmarks/ablate.py points",
        "The frame groups on synthetic point clouds.",
        lambda d: _by_group(d["summary"]),
        plot="ablate/points/accuracy.png",
    ),
    Section(
        "Ablation: shallow water",
        "ablate/swe/results.json",
        "python benchmarks/ablate.py swe",
        "Positional schemes and sphere models at equal time.",
        _ablate_swe,
        plot="ablate/swe/pareto_l2_vs_time.png",
    ),
)

# Results of benchmarks that write their own canonical file once they have run (added when present).
OPTIONAL_SECTIONS: tuple[Section, ...] = ()


# ------------------------------------------------------------------------------------------------ page


def render_section(section: Section, root: Path) -> Lines:
    path = root / section.path
    data = json.loads(path.read_text())
    lines = [
        f"## {section.title}",
        "",
        section.about,
        "",
        f"`{section.command}` → `benchmarks/results/{section.path}`; machine: {machine_of(data)}; date "
        f"{committed_date(path)}; load {load_range(data)}.",
        "",
        *section.render(data),
    ]
    if section.plot and (root / section.plot).is_file():
        lines += ["", f"![{section.title}](../benchmarks/results/{section.plot})"]
    return [*lines, ""]


def render(root: Path | None = None) -> str:
    """The whole page from the results under ``root`` (default ``benchmarks/results``)."""
    root = root or results_dir()
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python benchmarks/report.py` from the canonical result files under `benchmarks/results/` "
        "(do not edit by hand). Every figure was measured on the project's shared 2-core CPU machine (no GPU), "
        "float32, ratios side by side in one process in interleaved rounds; the load average recorded with each "
        "result is shown (another job ran beside most of them).",
        "",
    ]
    for section in SECTIONS + OPTIONAL_SECTIONS:
        if (root / section.path).is_file():
            lines += render_section(section, root)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
    parser.add_argument("--out", default=str(default), help="the page to write (default docs/benchmarks.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from the results")
    args = parser.parse_args(argv)
    page, out = render(), Path(args.out)
    if args.check:
        if not out.is_file() or out.read_text() != page:
            print(f"{out} is not the page the results give: run python benchmarks/report.py", file=sys.stderr)
            return 1
        print(f"{out} matches the results")
        return 0
    out.write_text(page)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
