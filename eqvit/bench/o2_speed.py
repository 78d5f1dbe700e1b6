"""Forward time, parameters and FLOPs of the D4 square O(2)-subgroup ViT against a timm ViT.

Models: ``o2vit_square_s`` (D4, total width D = 48 = 6 copies of the regular
representation stored irrep-wise, 256 patches of 16^2 pixels of a 256^2 image plus one class token,
depth 6, 3 heads, MLP over 12 regular D4-orbits = hidden width 96 = 2D) with coupled attention and
with irrep-wise attention (3 heads per irrep, 15 heads in all), against the timm
``VisionTransformer`` with the same width, tokens, depth, heads and MLP ratio
(``timm.create_model("vit_tiny_patch16_224", img_size=256, embed_dim=D, depth=6, num_heads=3,
mlp_ratio=2.0)``).

The models run interleaved (every repeat times each model once, in an order that rotates from one
repeat to the next) so that load from other jobs on a shared machine hits all of them alike;
medians are reported with the load average.
FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (:func:`eqvit.utils.flop_counter`: 2 per
multiply-add; matmuls, convolutions and attention; elementwise ops are not counted) for the timed inference forward and,
separately, for the training form's forward (which also derives its dense weights). The eqvit
models are timed in their inference form, ``eqvit.fold(model)``: every layer's weights (dense weights,
patch filters, APE, the norms' affine) derived once. ``--compile`` also times the coupled model and timm
under ``torch.compile(fullgraph=True)`` (``name[compiled]``, compiled in the warm-up), each compiled row's
ratio against compiled timm. Writes JSON and prints a table.

Runs on CUDA when present (``--device`` chooses; ``--amp`` for bf16 autocast). On CUDA the timed
forwards are measured with CUDA events, each row also gives the peak memory of one forward
(``torch.cuda.max_memory_allocated``), and ``meta.flash`` records the flash-attention check of
:mod:`eqvit.bench.device` (SDPA with only flash on the models' attention shapes, one forward of each
model with only flash); models that pass are timed with flash pinned, so flash is the backend used.

Usage: ``python benchmarks/o2_speed.py [--batches 1 16] [--threads 1 2] [--widths 48] [--compile]
[--device cuda --amp]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import timm
import torch

import eqvit
from eqvit.bench import device as _device
from eqvit.bench._paths import results_dir
from eqvit.utils import flop_counter

MODELS = ("o2vit_D4_coupled", "o2vit_D4_irrepwise", "timm_vit")
COMPILED = "[compiled]"  # suffix of a model timed under torch.compile(fullgraph=True)
COMPILED_MODELS = ("o2vit_D4_coupled", "timm_vit")  # the compiled pair (--compile)


def build(name: str, width: int) -> torch.nn.Module:
    if name == "timm_vit":
        model = timm.create_model(
            "vit_tiny_patch16_224", img_size=256, embed_dim=width, depth=6, num_heads=3, mlp_ratio=2.0, num_classes=38
        )
    else:
        attention = name.rsplit("_", 1)[1]
        model = eqvit.create_model("o2vit_square_s", embed_dim=width, attention=attention, num_classes=38)
    return model.eval()


def describe(name: str, model: torch.nn.Module) -> dict:
    """Width, tokens, depth, heads and MLP hidden width (to check that the models are comparable)."""
    if name == "timm_vit":
        blk = model.blocks[0]
        return {
            "width": model.embed_dim,
            "tokens": model.patch_embed.num_patches + model.num_prefix_tokens,
            "depth": len(model.blocks),
            "heads": blk.attn.num_heads,
            "mlp_hidden": blk.mlp.fc1.out_features,
        }
    blk = model.blocks[0]
    return {
        "width": model.embed_dim,
        "tokens": model.tokenizer.num_tokens + model.num_prefix_tokens,
        "depth": len(model.blocks),
        "heads": len(blk.attn.heads),
        "head_sizes": sorted({len(h) for h in blk.attn.heads}),
        "mlp_hidden": blk.mlp.folded_weights()[0].shape[0],
        "feature_type": str(model.token_type),
    }


def flops(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """``(FLOPs of the inference forward, FLOPs of the training form's forward)``: the training form
    derives its dense weights on every call, the folded form (``eqvit.fold``) once."""
    counts = []
    for m in (model.eval() if isinstance(model, timm.models.VisionTransformer) else eqvit.fold(model), model):
        with torch.no_grad(), flop_counter(display=False) as counter:
            m(x)
        counts.append(int(counter.get_total_flops()))
    return counts[0], counts[1]


def interleaved_times(
    models: dict[str, torch.nn.Module],
    x: torch.Tensor,
    repeats: int,
    device: torch.device | None = None,
    amp: bool = False,
    flash: dict[str, dict] | None = None,
) -> dict[str, list[float]]:
    """Seconds per forward, interleaved; on CUDA timed with CUDA events, under bf16 autocast with ``amp``
    and with flash pinned for the models whose ``flash`` check passed."""
    device = device if device is not None else x.device
    flash = flash or {}
    times = {name: [] for name in models}

    def forward(name: str) -> None:
        with _device.autocast(device, amp), _device.sdpa_context(device, flash.get(name)):
            models[name](x)

    with torch.no_grad():
        for name in models:  # warm-up (builds the cached dense weights)
            forward(name)
            forward(name)
        names = list(models)
        for r in range(repeats):
            # The order rotates every round: a model that always ran right after the same other one
            # would inherit that one's cache and allocator state in every round.
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(_device.time_ms(lambda name=name: forward(name), device) / 1e3)
    return times


def forward_peak_mb(
    model: torch.nn.Module, x: torch.Tensor, device: torch.device, amp: bool, flash: dict | None
) -> float:
    """Peak CUDA memory (``torch.cuda.max_memory_allocated``, MiB) of one ``no_grad`` forward."""
    _device.reset_peak_memory(device)
    with torch.no_grad(), _device.autocast(device, amp), _device.sdpa_context(device, flash):
        model(x)
    return _device.peak_memory_mb(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--threads", type=int, nargs="+", default=None, help="default: 1 2 on the CPU, 1 on CUDA")
    parser.add_argument("--widths", type=int, nargs="+", default=[48])
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default: 60 at batch 1, 15 above)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast for the timed forwards")
    parser.add_argument("--compile", action="store_true", help="also time the coupled model and timm compiled")
    parser.add_argument("--out", default=str(results_dir() / "o2_speed.json"))
    args = parser.parse_args(argv)
    device = _device.pick_device(args.device)
    if args.threads is None:
        args.threads = [1, 2] if device.type == "cpu" else [1]
    torch.manual_seed(0)
    flash_shapes = _device.flash_sdpa_check(device)
    flash_models: dict[str, dict] = {}
    if device.type == "cuda":
        print(f"flash SDPA on the models' attention shapes: {flash_shapes['flash']}")
    rows = []
    header = (
        f"{'D':>4} {'B':>3} {'thr':>3} | {'model':<27} {'fwd ms':>9} {'ratio':>6} {'GFLOP':>7} {'params':>8} | load"
    )
    print(header)
    print("-" * len(header))
    for width in args.widths:
        models = {name: build(name, width).to(device) for name in MODELS}
        shapes = {name: describe(name, m) for name, m in models.items()}
        for key in ("width", "tokens", "depth", "mlp_hidden"):
            if len({s[key] for s in shapes.values()}) != 1:
                raise RuntimeError(f"models differ in {key}: {shapes}")
        params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
        training_forms = models
        models = {name: m.eval() if name == "timm_vit" else eqvit.fold(m) for name, m in models.items()}
        if args.compile:
            models |= {n + COMPILED: torch.compile(models[n], fullgraph=True) for n in COMPILED_MODELS}
        names = list(models)
        flash = {}
        if device.type == "cuda":
            x1 = torch.randn(1, 3, 256, 256, device=device)
            flash = {name: _device.flash_model_check(m, x1, device, args.amp) for name, m in models.items()}
            for name, check in flash.items():
                print(f"flash check D={width} {name}: {check['flash']}")
            flash_models.update({f"{name} D={width}": check for name, check in flash.items()})
        for batch in args.batches:
            x = torch.randn(batch, 3, 256, 256).to(device)
            torch.set_num_threads(1)
            counted = {name: flops(m, x) for name, m in training_forms.items()}
            gflops = {name: c[0] / 1e9 for name, c in counted.items()}
            gflops_uncached = {name: c[1] / 1e9 for name, c in counted.items()}
            for threads in args.threads:
                torch.set_num_threads(threads)
                repeats = args.repeats or (60 if batch == 1 else 15)
                load_before = os.getloadavg()
                times = interleaved_times(models, x, repeats, device, args.amp, flash)
                load_after = os.getloadavg()
                med = {name: statistics.median(t) for name, t in times.items()}
                # a compiled row against compiled timm, an eager one against eager timm
                ref = {name: "timm_vit" + COMPILED * name.endswith(COMPILED) for name in names}
                per_round = {
                    name: statistics.median(a / b for a, b in zip(times[name], times[ref[name]])) for name in names
                }
                base = {name: name.removesuffix(COMPILED) for name in names}
                row = {
                    "width": width,
                    "batch": batch,
                    "threads": threads,
                    "repeats": repeats,
                    "load_avg_1min": [round(load_before[0], 2), round(load_after[0], 2)],
                    "models": {
                        name: {
                            "forward_ms_median": med[name] * 1e3,
                            "forward_ms_min": min(times[name]) * 1e3,
                            "ratio_to_timm": med[name] / med[ref[name]],
                            "ratio_to_timm_per_round_median": per_round[name],
                            "gflops": gflops[base[name]],
                            "gflops_training_form": gflops_uncached[base[name]],
                            "params": params[base[name]],
                            **shapes[base[name]],
                        }
                        for name in names
                    },
                }
                if device.type == "cuda":
                    for name in names:
                        row["models"][name]["sdpa_backend"] = _device.backend_used(flash.get(name))
                        row["models"][name]["forward_peak_mb"] = forward_peak_mb(
                            models[name], x, device, args.amp, flash.get(name)
                        )
                rows.append(row)
                for name in names:
                    r = row["models"][name]
                    print(
                        f"{width:>4} {batch:>3} {threads:>3} | {name:<27} {r['forward_ms_median']:>9.2f} "
                        f"{r['ratio_to_timm']:>6.3f} {r['gflops']:>7.3f} {r['params']:>8d} | "
                        f"{row['load_avg_1min'][0]:.2f}->{row['load_avg_1min'][1]:.2f}"
                    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        **_device.device_info(device),
        "dtype": _device.amp_dtype(args.amp),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "note": (
            "interleaved timing; ratio = median o2vit time / median timm time (a [compiled] row: over compiled "
            "timm); FLOPs = 2 x multiply-adds of a folded inference forward (gflops_training_form: the training "
            "form, which derives its weights per call)"
        ),
    }
    if device.type == "cuda":
        meta["timing"] = "CUDA events; forward_peak_mb = torch.cuda.max_memory_allocated of one forward"
    meta["flash"] = {"sdpa_shapes": flash_shapes, "models": flash_models or {"device": device.type, "flash": "n/a"}}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
