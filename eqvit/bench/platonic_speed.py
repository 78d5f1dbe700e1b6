"""Platonic Transformer forward time against a timm ViT of equal |G|·C width and token count.

The Platonic seed's claim is "the same computational budget": with the total width ``|G| * C``
fixed, a Platonic Transformer has the computation graph of a standard ViT of that width (the
group-convolution linears are dense ``[|G| C', |G| C]`` matrices, the frames are extra heads). This
script measures it. For every Platonic model a timm baseline is built with the same total width,
depth, MLP ratio, total heads ``|G| * H`` (so the same head dim), the same token count and no class
token (ours has none):

* points (``platonic_points_s``, N = 256 points, frames trivial / T / O / I): a linear point
  embedding of ``(pos, feat)`` + ``timm.models.vision_transformer.Block`` x depth + LayerNorm +
  mean pool + linear head;
* images (``platonic_image_s``, C4 / D4 frames): ``timm.models.vision_transformer.VisionTransformer``
  with ``class_token=False, global_pool="avg"``, at 32x32 / 4x4 patches (64 tokens) and
  224x224 / 16x16 patches (196 tokens);
* sphere (``platonic_sphere_4x128``, I frames, 960 tokens): the same icosphere lifting convolution
  (:class:`~eqvit.nn.tokenizers.icosphere.IcospherePatchEmbed`) + timm Blocks + LayerNorm +
  :class:`~eqvit.nn.tokenizers.icosphere.IcosphereUnpatchify`.

Forward time: float32, CPU, ``eval()``, ``torch.no_grad``, the Platonic model in its inference form
(``eqvit.fold``), batch 1 and 16; the two models of a
pair run alternately inside one loop (order swapped every round; at least ``--repeats`` rounds and
enough to fill ``--min-seconds`` per pair, so millisecond cases get hundreds), and the table gives the median
of each and the median of the per-round ratios ours / timm, with the load
average (``os.getloadavg``) before and after. FLOPs come from ``FlopCounterMode``
(:func:`eqvit.utils.flop_counter`) with the explicit-softmax attention path (the CPU SDPA kernel is not
counted by it), parameters from ``model.parameters()``.

On CUDA (the default when present; ``--device`` chooses, ``--amp`` adds bf16 autocast to the model
forwards) the forwards are timed with CUDA events, each row also gives the peak memory of one forward
(``torch.cuda.max_memory_allocated``) and the SDPA backend, and ``meta.flash`` records the
flash-attention check of :mod:`eqvit.bench.device`: SDPA with only the flash backend on the models'
attention shapes, and one forward of every model with only flash; models that pass are timed with
flash pinned, so flash is the backend used.

A second table times :class:`~eqvit.nn.regular.GroupConvLinear` with ``impl="cayley"`` against
``impl="fourier"`` (same weights; forward under ``no_grad`` and forward + backward) for T, O, I at
C = 4 ... 64 channels per frame on 1024 tokens, next to the cost model's ratio
``fourier_cost / cayley_cost``, to check the ``"auto"`` rule (Fourier below 1/3).

Usage::

    python benchmarks/platonic_speed.py                 # full run, one thread
    python benchmarks/platonic_speed.py --quick         # CI-sized
    python benchmarks/platonic_speed.py --threads 2 --repeats 15
    python benchmarks/platonic_speed.py --device cuda --amp
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

import eqvit
from eqvit.bench import device as _device
from eqvit.bench._paths import results_dir
from eqvit.models.platonic import spatial_frames
from eqvit.nn.regular import GroupConvLinear
from eqvit.nn.sdpa import ScaledDotProductAttention
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed, IcosphereUnpatchify
from eqvit.utils import flop_counter

DEFAULT_OUT = results_dir() / "platonic_speed.json"
TARGET_RATIO = 1.15


# --------------------------------------------------------------------------------------------
# timm baselines


class TimmPointViT(nn.Module):
    """Points as tokens: ``Linear(3 + C_in -> D)`` + timm Blocks + LayerNorm + mean pool + linear head."""

    def __init__(self, in_chans: int, embed_dim: int, depth: int, num_heads: int, mlp_ratio: float, num_classes: int):
        super().__init__()
        self.embed = nn.Linear(3 + in_chans, embed_dim)
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio, qkv_bias=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, pos: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        centred = pos - pos.mean(dim=1, keepdim=True)
        tokens = self.blocks(self.embed(torch.cat([centred, feat], dim=-1)))
        return self.head(self.norm(tokens).mean(1))


class TimmSphereViT(nn.Module):
    """Icosphere patches: the lifting convolution + timm Blocks + LayerNorm + the projection convolution."""

    def __init__(
        self,
        in_chans: int,
        out_chans: int,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        input_level: int,
        patch_level: int,
    ):
        super().__init__()
        self.embed = IcospherePatchEmbed(in_chans, embed_dim, input_level, patch_level)
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio, qkv_bias=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = IcosphereUnpatchify(embed_dim, out_chans, input_level, patch_level)

    @property
    def num_tokens(self) -> int:
        return self.embed.num_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(x))))


def total_heads(model: nn.Module) -> tuple[int, int, int]:
    """``(|G|, H per frame, head dim)`` of a Platonic model."""
    attn = model.blocks[0].attn
    return attn.order, attn.num_heads, attn.head_dim


def mlp_ratio_of(model: nn.Module) -> float:
    block = model.blocks[0]
    return block.mlp.fc1.out_channels / block.mlp.fc1.in_channels


# --------------------------------------------------------------------------------------------
# cases: (name, platonic model, timm model, inputs)


def point_case(group: str, batch: int, points: int) -> tuple[nn.Module, nn.Module, tuple[torch.Tensor, ...]]:
    ours = eqvit.create_model("platonic_points_s", group=group, num_points=points)
    G, H, _ = total_heads(ours)
    width, depth = ours.embed_dim, len(ours.blocks)
    ref = TimmPointViT(ours.in_chans, width, depth, G * H, mlp_ratio_of(ours), 10)
    gen = torch.Generator().manual_seed(0)
    inputs = (torch.randn(batch, points, 3, generator=gen), torch.ones(batch, points, ours.in_chans))
    return ours, ref, inputs


def image_case(group: str, batch: int, img: int, patch: int) -> tuple[nn.Module, nn.Module, tuple[torch.Tensor, ...]]:
    ours = eqvit.create_model("platonic_image_s", group=group, img_size=img, patch_size=patch)
    G, H, _ = total_heads(ours)
    ref = VisionTransformer(
        img_size=img,
        patch_size=patch,
        in_chans=ours.in_chans,
        num_classes=10,
        embed_dim=ours.embed_dim,
        depth=len(ours.blocks),
        num_heads=G * H,
        mlp_ratio=mlp_ratio_of(ours),
        qkv_bias=True,
        class_token=False,
        global_pool="avg",
    )
    x = torch.randn(batch, ours.in_chans, img, img, generator=torch.Generator().manual_seed(0))
    return ours, ref, (x,)


def sphere_case(group: str, batch: int) -> tuple[nn.Module, nn.Module, tuple[torch.Tensor, ...]]:
    ours = eqvit.create_model("platonic_sphere_4x128", group=group)
    G, H, _ = total_heads(ours)
    cfg = ours.config
    ref = TimmSphereViT(
        ours.in_chans,
        ours.out_chans,
        ours.embed_dim,
        len(ours.blocks),
        G * H,
        mlp_ratio_of(ours),
        cfg["input_level"],
        cfg["patch_level"],
    )
    x = torch.randn(batch, ours.in_chans, *ours.domain.shape, generator=torch.Generator().manual_seed(0))
    return ours, ref, (x,)


def num_tokens(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    if len(inputs) == 2:  # points
        return inputs[0].shape[1]
    owner = model.tokenizer if hasattr(model, "tokenizer") else model
    if hasattr(owner, "num_tokens"):
        return int(owner.num_tokens)
    return int(model.patch_embed.num_patches)  # timm VisionTransformer


# --------------------------------------------------------------------------------------------
# measurement


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def set_fused(model: nn.Module, fused: bool) -> None:
    for m in model.modules():
        if hasattr(m, "fused_attn") and not isinstance(m, (Block,)):  # timm Attention
            m.fused_attn = fused
        if isinstance(m, ScaledDotProductAttention):  # every eqvit attention, training or folded form
            m.fused = fused


def flops(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    """Total FLOPs of one forward; attention on its explicit path so that its matmuls are counted."""
    set_fused(model, False)
    try:
        with torch.no_grad(), flop_counter(display=False) as counter:
            model(*inputs)
    finally:
        set_fused(model, True)
    return int(counter.get_total_flops())


def interleaved(
    fns: list[Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    device: torch.device | None = None,
    min_seconds: float = 0.0,
) -> list[list[float]]:
    """Seconds of each function, alternating between them (order rotated every round).

    At least ``repeats`` rounds, and for fast functions as many as fill ``min_seconds`` (estimated from
    the last warm-up round), so that millisecond cases get enough samples to see past the noise of a
    shared machine. On CUDA each call is timed with CUDA events (after a synchronize), on the CPU with
    ``perf_counter``.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    round_s = 0.0
    for fn in fns:
        for _ in range(max(warmup, 1)):
            last = _device.time_ms(fn, device) / 1e3
        round_s += last
    rounds = max(repeats, math.ceil(min_seconds / max(round_s, 1e-9)))
    _device.sync(device)
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        order = list(range(len(fns)))
        if r % 2:
            order.reverse()
        for i in order:
            times[i].append(_device.time_ms(fns[i], device) / 1e3)
    return times


# Set by main(): the device, bf16 autocast for the model forwards, and the flash checks of the models.
DEVICE = torch.device("cpu")
AMP = False
FLASH_CHECKS: dict[str, dict[str, Any]] = {}


def _on_device(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return model.to(DEVICE), tuple(t.to(DEVICE) for t in inputs)


def forward_peak_mb(fn: Callable[[], Any]) -> float | None:
    """``torch.cuda.max_memory_allocated`` (MiB) of one call on CUDA; ``None`` on the CPU."""
    if DEVICE.type != "cuda":
        return None
    _device.reset_peak_memory(DEVICE)
    fn()
    return _device.peak_memory_mb(DEVICE)


def compare(
    name: str,
    ours: nn.Module,
    ref: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    batch: int,
    repeats: int,
    min_seconds: float = 0.0,
) -> dict[str, Any]:
    trained, inputs = _on_device(ours.eval(), inputs)
    ours = eqvit.fold(trained)  # the inference form: group-convolution weights and affines folded once
    ref = ref.to(DEVICE).eval()
    checks = {}
    if DEVICE.type == "cuda":
        checks = {who: _device.flash_model_check(m, inputs, DEVICE, AMP) for who, m in (("ours", ours), ("timm", ref))}
        FLASH_CHECKS.update({f"{name} b={batch} {who}": c for who, c in checks.items()})

    def run(who: str, model: nn.Module) -> Callable[[], Any]:
        def fn() -> None:
            with _device.autocast(DEVICE, AMP), _device.sdpa_context(DEVICE, checks.get(who)):
                model(*inputs)

        return fn

    load_before = os.getloadavg()[0]
    with torch.no_grad():
        t_ours, t_ref = interleaved(
            [run("ours", ours), run("timm", ref)], repeats, warmup=2, device=DEVICE, min_seconds=min_seconds
        )
        peak = {who: forward_peak_mb(run(who, m)) for who, m in (("ours", ours), ("timm", ref))}
    load_after = os.getloadavg()[0]
    G, H, D = total_heads(trained)
    impls = sorted({m.impl for m in trained.modules() if isinstance(m, GroupConvLinear)})
    row = {
        "case": name,
        "batch": batch,
        "group_order": G,
        "tokens": num_tokens(trained, inputs),
        "width": ours.embed_dim,
        "depth": len(ours.blocks),
        "mlp_ratio": mlp_ratio_of(trained),
        "heads_total": G * H,
        "head_dim": D,
        "linear_impls": impls,
        "ours_s": statistics.median(t_ours),
        "timm_s": statistics.median(t_ref),
        "ratio_of_medians": statistics.median(t_ours) / statistics.median(t_ref),
        "ratio_median": statistics.median(a / b for a, b in zip(t_ours, t_ref)),
        "ours_params": count_params(trained),
        "timm_params": count_params(ref),
        "ours_gflops": flops(ours, inputs) / 1e9,
        "timm_gflops": flops(ref, inputs) / 1e9,
        "repeats": len(t_ours),
        "loadavg": [round(load_before, 2), round(load_after, 2)],
    }
    if DEVICE.type == "cuda":
        row.update(
            ours_forward_peak_mb=peak["ours"],
            timm_forward_peak_mb=peak["timm"],
            ours_sdpa_backend=_device.backend_used(checks.get("ours")),
            timm_sdpa_backend=_device.backend_used(checks.get("timm")),
        )
    print(
        f"{name:28s} b={batch:<3d} |G|={G:<2d} tok={row['tokens']:<4d} heads={G * H}x{D:<3d} "
        f"ours {row['ours_s'] * 1e3:8.1f} ms  timm {row['timm_s'] * 1e3:8.1f} ms  ratio {row['ratio_median']:.2f}  "
        f"GFLOP {row['ours_gflops']:7.2f}/{row['timm_gflops']:7.2f}  "
        f"params {row['ours_params']:>9,}/{row['timm_params']:>9,}"
        f"  impl {','.join(impls)}  load {load_before:.1f}->{load_after:.1f}",
        flush=True,
    )
    return row


def train_step(layer: GroupConvLinear, x: torch.Tensor) -> None:
    layer.zero_grad(set_to_none=True)
    layer(x).sum().backward()


def linear_micro(groups: list[str], channels: list[int], tokens: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for name in groups:
        group = spatial_frames(name)
        for c in channels:
            torch.manual_seed(0)
            cay = GroupConvLinear(group, c, c, impl="cayley")
            fou = GroupConvLinear(group, c, c, impl="fourier")
            fou.load_state_dict(cay.state_dict())
            cay, fou = cay.to(DEVICE), fou.to(DEVICE)
            x = torch.randn(tokens, group.order * c).to(DEVICE)
            with torch.no_grad():
                err = (cay(x) - fou(x)).abs().max().item() / cay(x).abs().max().item()
                fwd = interleaved([lambda m=cay, x=x: m(x), lambda m=fou, x=x: m(x)], repeats, device=DEVICE)
            xg = x.clone().requires_grad_(True)
            bwd = interleaved(
                [lambda m=cay, x=xg: train_step(m, x), lambda m=fou, x=xg: train_step(m, x)], repeats, device=DEVICE
            )
            row = {
                "group": name,
                "order": group.order,
                "channels": c,
                "tokens": tokens,
                "cost_ratio": cay.fourier_cost() / cay.cayley_cost(),
                "auto": GroupConvLinear(group, c, c).impl,
                "cayley_fwd_ms": statistics.median(fwd[0]) * 1e3,
                "fourier_fwd_ms": statistics.median(fwd[1]) * 1e3,
                "fwd_speedup": statistics.median(a / b for a, b in zip(fwd[0], fwd[1])),
                "cayley_train_ms": statistics.median(bwd[0]) * 1e3,
                "fourier_train_ms": statistics.median(bwd[1]) * 1e3,
                "train_speedup": statistics.median(a / b for a, b in zip(bwd[0], bwd[1])),
                "rel_max_diff": err,
                "loadavg": round(os.getloadavg()[0], 2),
            }
            rows.append(row)
            print(
                f"{name:2s} C={c:<3d} cost fourier/cayley {row['cost_ratio']:.3f} (auto: {row['auto']:7s})  "
                f"fwd cayley {row['cayley_fwd_ms']:7.2f} ms fourier {row['fourier_fwd_ms']:7.2f} ms "
                f"speedup {row['fwd_speedup']:5.2f} | fwd+bwd cayley {row['cayley_train_ms']:7.2f} ms "
                f"fourier {row['fourier_train_ms']:7.2f} ms speedup {row['train_speedup']:5.2f}  diff {err:.1e}",
                flush=True,
            )
    return rows


def suggest_threshold(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The cost-ratio threshold t ("Fourier when fourier_cost < t * cayley_cost") with the fewest wrong picks.

    Candidates are the midpoints between consecutive measured cost ratios; a pick is wrong when it
    chooses the slower form. Ties go to the largest t with the fewest errors weighted by lost time.
    """
    pts = sorted((r["cost_ratio"], r[key]) for r in rows)
    ratios = [p[0] for p in pts]
    candidates = [ratios[0] / 2] + [(a + b) / 2 for a, b in itertools.pairwise(ratios)] + [ratios[-1] * 2]

    def loss(t: float) -> tuple[int, float]:
        wrong, lost = 0, 0.0
        for ratio, speedup in pts:
            fourier = ratio < t
            if fourier != (speedup > 1):
                wrong += 1
                lost += abs(1 - speedup)
        return wrong, lost

    best = min(candidates, key=lambda t: (*loss(t), -t))
    current = loss(1 / 3)
    return {
        "key": key,
        "threshold": best,
        "wrong": loss(best)[0],
        "current_threshold": 1 / 3,
        "current_wrong": current[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds per pair at batch 1")
    parser.add_argument("--big-repeats", type=int, default=5, help="timed rounds per pair at batch > 1")
    parser.add_argument(
        "--min-seconds", type=float, default=3.0, help="more rounds for fast pairs: at least this long per pair"
    )
    parser.add_argument("--points", type=int, default=256)
    parser.add_argument("--point-groups", nargs="+", default=["trivial", "T", "O", "I"])
    parser.add_argument("--image-groups", nargs="+", default=["C4", "D4"])
    parser.add_argument("--micro-groups", nargs="+", default=["T", "O", "I"])
    parser.add_argument("--micro-channels", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--micro-tokens", type=int, default=1024)
    parser.add_argument("--micro-repeats", type=int, default=15)
    parser.add_argument("--skip", nargs="*", default=[], choices=["points", "images", "sphere", "micro"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="CI-sized: batch 1, 3 repeats, small micro table")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast for the model forwards (micro: float32)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    global DEVICE, AMP
    DEVICE, AMP = _device.pick_device(args.device), args.amp
    flash_shapes = _device.flash_sdpa_check(DEVICE)
    if DEVICE.type == "cuda":
        print(f"flash SDPA on the models' attention shapes: {flash_shapes['flash']}", flush=True)
    if args.quick:
        args.batches, args.repeats, args.big_repeats, args.points, args.min_seconds = [1], 3, 2, 64, 0.0
        args.point_groups, args.image_groups = ["trivial", "O"], ["D4"]
        args.micro_groups, args.micro_channels, args.micro_tokens, args.micro_repeats = ["O"], [4, 16], 256, 3
        if args.out == str(DEFAULT_OUT):
            args.out = str(DEFAULT_OUT.with_name("platonic_speed_quick.json"))
    torch.set_num_threads(args.threads)
    wall = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for batch in args.batches:
        reps = args.repeats if batch == 1 else args.big_repeats
        if "points" not in args.skip:
            for g in args.point_groups:
                case = point_case(g, batch, args.points)
                rows.append(compare(f"points N={args.points} {g}", *case, batch, reps, args.min_seconds))
        if "images" not in args.skip:
            for img, patch in ((32, 4), (224, 16)):
                if args.quick and img > 32:
                    continue
                for g in args.image_groups:
                    case = image_case(g, batch, img, patch)
                    rows.append(compare(f"image {img}/{patch} {g}", *case, batch, reps, args.min_seconds))
        if "sphere" not in args.skip and not args.quick:
            rows.append(compare("sphere 4x128 I", *sphere_case("I", batch), batch, reps, args.min_seconds))
    micro = []
    thresholds = {}
    if "micro" not in args.skip:
        micro = linear_micro(args.micro_groups, args.micro_channels, args.micro_tokens, args.micro_repeats)
        thresholds = {k: suggest_threshold(micro, k) for k in ("fwd_speedup", "train_speedup")}
        for k, v in thresholds.items():
            print(
                f"{k}: best threshold {v['threshold']:.3f} ({v['wrong']} wrong picks), "
                f"current 1/3: {v['current_wrong']} wrong picks"
            )
    meta = {
        **_device.device_info(DEVICE),
        "threads": args.threads,
        "dtype": _device.amp_dtype(args.amp),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "target_ratio": TARGET_RATIO,
        "wall_s": time.perf_counter() - wall,
        "loadavg_end": [round(v, 2) for v in os.getloadavg()],
        "note": "ratio = median over interleaved rounds of ours/timm; FLOPs with explicit attention matmuls",
    }
    if DEVICE.type == "cuda":
        meta["timing"] = "CUDA events; *_forward_peak_mb = torch.cuda.max_memory_allocated of one forward"
        meta["micro_dtype"] = "float32"
    meta["flash"] = {"sdpa_shapes": flash_shapes, "models": FLASH_CHECKS or {"device": DEVICE.type, "flash": "n/a"}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"meta": meta, "models": rows, "group_conv_linear": micro, "auto_threshold": thresholds}, indent=2)
    )
    print(f"wrote {out} ({meta['wall_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
