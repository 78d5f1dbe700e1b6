"""ViT-S/B-scale speed: timm against the eqvit Schur-layout models against octic-vits.

Rows, at ViT-S (384 wide, 6 heads) and ViT-B (768, 12 heads), 224^2 images, 16^2 patches, depth 12,
MLP ratio 4, 1000 classes, float32:

* ``timm``: ``timm.create_model("vit_small_patch16_224")`` / ``"vit_base_patch16_224"`` (the reference);
* ``eqvit_d4``: ``o2vit_d4_{small,base}_patch16_224`` (D4, components layout: Schur block matmuls),
  timed in its inference form ``eqvit.fold(model)``;
* ``platonic_d4``: ``platonic_d4_{small,base}_patch16_224`` (D4 frames), folded likewise;
* ``octic``: octic-vits' ``OcticVisionTransformer`` (Apache-2.0, loaded at run time from
  ``$EQVIT_PEERS/octic_vits``, ``../shared/peers/octic_vits`` beside the checkout, or ``--octic PATH``;
  never copied), all 12 blocks octic and the power-spectrum invariant head. Its constructor cannot build
  that (``octic_equi_break_layer`` -1 and 12 fail its asserts), so it is built with 11, the last block
  is replaced by an octic block and the break layer set to 12; its Triton GELU does not run on a CPU, so
  every block's activation is its plain ``GeluD8`` wrapped for the 5-tuple layout its MLP passes.
  Without the folder the column is skipped and the table says so.

For every (size, threads, batch) the forwards (``eval()``, ``no_grad``) run in interleaved rounds, the
order rotating from round to round; the figure is the median over rounds of the per-round time
ratio to timm (and the median time). Per model and size: parameters, FLOPs
(:func:`eqvit.utils.flop_counter`, 2 per multiply-add, batch 1), the fp32 invariance
error (max over the 8 D4 image transforms of ``|f(g x) - f(x)|_max / |f(x)|_max``), a training step
(the training form, forward + backward of a cross-entropy loss + an AdamW update at batch 8, interleaved like the
forwards, ratio to timm) and the peak allocated tensor memory of the step
(:func:`eqvit.bench._memory.peak_allocated_mb`, the CPU analogue of ``torch.cuda.max_memory_allocated``,
independent of the C allocator).
Memory of training, two ways: the step's own peak (activations and gradients: "allocated"), and the
whole iteration's peak that ``torch.cuda.max_memory_allocated`` reports on a GPU ("total": parameters
and AdamW state, which live across steps, plus the peak of forward, backward and the optimizer update;
:func:`training_memory_mb`). ``os.getloadavg()`` is recorded before and after each measurement.

Usage: ``python benchmarks/scale_speed.py [--sizes small base] [--batches 1 8] [--threads 1 2]
[--rounds N] [--train-rounds N] [--models eqvit_d4 platonic_d4 octic] [--compile-train] [--profile] [--quick]``
(``--models``: the rows timed beside timm; ``--profile``: the top operators by self time of the folded D4
forward at each batch, 1 thread); ``--quick`` is a smoke run (depth 2, 64^2 images, batch 1, 1 thread, 2 rounds) for CI.
Writes ``benchmarks/results/scale_speed.json`` (``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torch import nn

import eqvit
from eqvit.bench._memory import peak_allocated_mb
from eqvit.bench._paths import peers_dir, results_dir
from eqvit.utils import flop_counter

SIZES = {"small": dict(embed_dim=384, num_heads=6), "base": dict(embed_dim=768, num_heads=12)}
MODELS = ("timm", "eqvit_d4", "platonic_d4", "octic")
OCTIC_DEFAULT = None if peers_dir() is None else peers_dir() / "octic_vits"


# ----------------------------------------------------------------------------------------- models
def load_octic(folder: Path):
    """The peer package ``octic_vits`` imported from ``folder`` (by path), or None when it is absent."""
    if not (folder / "model.py").is_file():
        return None
    parent = str(folder.parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    return importlib.import_module(folder.name)


def build_octic(pkg, size: str, depth: int, img_size: int) -> nn.Module:
    """All-octic, invariant octic-vits model (see the module docstring for the two work-arounds)."""
    layers = importlib.import_module(f"{pkg.__name__}.d8_layers")
    utils = importlib.import_module(f"{pkg.__name__}.d8_utils")

    class Gelu5(nn.Module):  # the plain GeluD8 on the 5-tuple layout its MLP passes
        def __init__(self) -> None:
            super().__init__()
            self.gelu = layers.GeluD8()

        def forward(self, xs):
            return utils.convert_8tuple_to_5tuple(self.gelu(utils.convert_5tuple_to_8tuple(xs)))

    s = SIZES[size]
    model = pkg.OcticVisionTransformer(
        img_size=img_size, patch_size=16, num_classes=1000, depth=depth, mlp_ratio=4.0, qkv_bias=True,
        invariant=True, octic_equi_break_layer=depth - 1, **s,
    )  # fmt: skip
    model.blocks[depth - 1] = layers.BlockD8(
        dim=s["embed_dim"], num_heads=s["num_heads"], mlp_ratio=4.0, qkv_bias=True, init_values=1e-4,
        norm_layer=layers.LayerNormD8, act_layer=Gelu5,
    )  # fmt: skip
    model.octic_equi_break_layer = depth
    for block in model.blocks:
        block.mlp.act = Gelu5()
    return model


def training_form(name: str, size: str, depth: int, img_size: int, octic_pkg) -> nn.Module:
    """Model ``name`` at ``size`` as users train it."""
    over = {} if depth == 12 and img_size == 224 else dict(depth=depth, img_size=img_size)
    if name == "timm":
        return timm.create_model(f"vit_{size}_patch16_224", **over)
    if name == "octic":
        return build_octic(octic_pkg, size, depth, img_size)
    family = {"eqvit_d4": "o2vit_d4", "platonic_d4": "platonic_d4"}[name]
    return eqvit.create_model(f"{family}_{size}_patch16_224", **over)


def build(name: str, size: str, depth: int, img_size: int, octic_pkg) -> tuple[nn.Module, nn.Module]:
    """``(training form, timed inference form)`` of model ``name`` at ``size``: the eqvit models folded."""
    model = training_form(name, size, depth, img_size, octic_pkg)
    return model, (model if name in ("timm", "octic") else eqvit.fold(model))


# ----------------------------------------------------------------------------------------- measures
def count_flops(model: nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad(), flop_counter(display=False) as counter:
        model(x)
    return int(counter.get_total_flops())


def d4_images(x: torch.Tensor) -> list[torch.Tensor]:
    """The 8 images ``g . x`` of the D4 action on ``[B, C, H, W]`` (rotations by 90 degrees, and transposed)."""
    rots = [torch.rot90(x, k, dims=(-2, -1)) for k in range(4)]
    return rots + [r.transpose(-2, -1) for r in rots]


def invariance_error(model: nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        ref = model(x)
        return max(float((model(gx) - ref).abs().max() / ref.abs().max()) for gx in d4_images(x))


def interleaved(fns: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of every function, ``rounds`` interleaved rounds with a rotating order."""
    names = list(fns)
    for name in names:  # warm-up
        fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def summarise(times: dict[str, list[float]], reference: str = "timm") -> dict[str, dict]:
    ref = times[reference]
    return {
        name: dict(
            median_ms=1e3 * statistics.median(t),
            ratio=statistics.median([a / b for a, b in zip(t, ref)]),
        )
        for name, t in times.items()
    }


def train_step(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> Callable[[], None]:
    """One training iteration: forward, cross-entropy backward and an AdamW update."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), target).backward()
        optimizer.step()

    return step


def compiled_training(
    models: dict[str, nn.Module], x: torch.Tensor, target: torch.Tensor, rounds: int
) -> dict[str, dict]:
    """The training step of every model under ``torch.compile`` (Inductor, the default mode), interleaved like
    the eager steps, ratio to compiled timm; ``first_call_s`` is the first step (compilation included), cold:
    with the compiler's on-disk caches off for every model, which would otherwise make a model compiled by an
    earlier run (the peers, whose code changes less often) look several times cheaper. A model that does not
    compile gets its error instead of times."""
    steps, first, failed = {}, {}, {}
    for name, model in models.items():
        step = train_step(torch.compile(model), x, target)
        start = time.perf_counter()
        try:
            with torch.compiler.config.patch(force_disable_caches=True):
                step()
        except Exception as err:  # a peer's code may not compile; the table says why
            failed[name] = dict(error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
            continue
        first[name], steps[name] = time.perf_counter() - start, step
    if "timm" not in steps:
        raise RuntimeError(f"timm's training step did not compile: {failed['timm']['error']}")
    load0 = os.getloadavg()[0]
    summary = summarise(interleaved(steps, rounds))
    for name in steps:
        summary[name]["first_call_s"] = first[name]
    return dict(load=[load0, os.getloadavg()[0]], models={**summary, **failed})


def tensor_mb(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def training_memory_mb(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> float:
    """Peak tensor memory of a whole training iteration, what ``torch.cuda.max_memory_allocated`` reports
    for one on a GPU: the parameters and the AdamW state (two moments per parameter, created by a first
    step) that live across steps, plus the peak of one step's forward, backward and optimizer update."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), target).backward()
        optimizer.step()

    step()  # creates the optimizer state
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    resident = tensor_mb(model.parameters()) + tensor_mb(state)
    peak = peak_allocated_mb(step)
    model.zero_grad(set_to_none=True)
    return resident + peak


def profile_forward(model: nn.Module, x: torch.Tensor, top: int = 15) -> list[dict]:
    """The ``top`` operators of two no-grad forwards by self CPU time (``torch.profiler``): name, calls,
    self ms per forward and share of the total."""
    with torch.no_grad():
        model(x)
        with torch.profiler.profile() as prof:
            model(x)
            model(x)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    return [
        dict(op=e.key, calls=e.count // 2, self_ms=e.self_cpu_time_total / 2e3, share=e.self_cpu_time_total / total)
        for e in events[:top]
    ]


# ----------------------------------------------------------------------------------------- driver
def run(args: argparse.Namespace) -> dict:
    octic_pkg = None if args.no_octic or args.octic is None else load_octic(Path(args.octic))
    chosen = ["timm", *args.models]  # timm is the reference of every ratio
    names = [n for n in MODELS if n in chosen and (n != "octic" or octic_pkg is not None)]
    where = args.octic or "../shared/peers (not a checkout; pass --octic PATH)"
    why = "--no-octic" if args.no_octic else f"no octic_vits package at {where}"
    skipped = [] if octic_pkg is not None or "octic" not in chosen else [f"octic: {why}"]
    out = dict(
        meta=dict(
            torch=torch.__version__, timm=timm.__version__, python=platform.python_version(), cpu=platform.processor(),
            quick=args.quick, depth=args.depth, img_size=args.img_size, rounds=args.rounds,
            train_rounds=args.train_rounds, skipped=skipped,
        ),
        sizes={},
    )  # fmt: skip
    for size in args.sizes:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        built = {n: build(n, size, args.depth, args.img_size, octic_pkg) for n in names}
        x1 = torch.randn(1, 3, args.img_size, args.img_size)
        info = {}
        for n, (train_form, infer_form) in built.items():
            train_form.eval()
            info[n] = dict(
                params=sum(p.numel() for p in train_form.parameters()),
                flops=count_flops(infer_form, x1),
                invariance_fp32=invariance_error(infer_form, torch.randn(2, 3, args.img_size, args.img_size)),
            )
        for n in names:
            info[n]["flops_ratio"] = info[n]["flops"] / info["timm"]["flops"]
        forward = []
        for threads in args.threads:
            torch.set_num_threads(threads)
            for batch in args.batches:
                x = torch.randn(batch, 3, args.img_size, args.img_size)
                load0 = os.getloadavg()[0]
                with torch.no_grad():
                    fns = {n: (lambda m=m, x=x: m(x)) for n, (_, m) in built.items()}
                    times = interleaved(fns, args.rounds)
                forward.append(
                    dict(threads=threads, batch=batch, load=[load0, os.getloadavg()[0]], models=summarise(times))
                )
        torch.set_num_threads(1)
        training = None
        if not args.no_train:
            xb = torch.randn(args.train_batch, 3, args.img_size, args.img_size)
            target = torch.randint(0, 1000, (args.train_batch,))
            steps = {n: train_step(m.train(), xb, target) for n, (m, _) in built.items()}
            load0 = os.getloadavg()[0]
            times = interleaved(steps, args.train_rounds)
            training = dict(batch=args.train_batch, load=[load0, os.getloadavg()[0]], models=summarise(times))
            for n, step in steps.items():
                training["models"][n]["peak_allocated_mb"] = peak_allocated_mb(step)
                training["models"][n]["training_memory_mb"] = training_memory_mb(built[n][0], xb, target)
            timm_alloc = training["models"]["timm"]["peak_allocated_mb"]
            timm_total = training["models"]["timm"]["training_memory_mb"]
            for n in steps:
                m = training["models"][n]
                m["peak_allocated_ratio"] = m["peak_allocated_mb"] / timm_alloc
                m["training_memory_ratio"] = m["training_memory_mb"] / timm_total
        profiles = {}
        if args.profile and "eqvit_d4" in built:
            torch.set_num_threads(1)
            for batch in args.batches:
                x = torch.randn(batch, 3, args.img_size, args.img_size)
                profiles[f"eqvit_d4 b={batch}"] = profile_forward(built["eqvit_d4"][1], x)
        out["sizes"][size] = dict(info=info, forward=forward, training=training, profiles=profiles)
        del built
    if args.compile_train:
        # after every eager measurement: in one run the eager ViT-B forwards at batch 8 timed after the ViT-S
        # compilation were a quarter slower than in a fresh process; each size's compiled caches are reset
        for size in args.sizes:
            torch.manual_seed(0)
            forms = {n: training_form(n, size, args.depth, args.img_size, octic_pkg).train() for n in names}
            xb = torch.randn(args.train_batch, 3, args.img_size, args.img_size)
            target = torch.randint(0, 1000, (args.train_batch,))
            out["sizes"][size]["training"]["compiled"] = compiled_training(forms, xb, target, args.train_rounds)
            del forms
            torch.compiler.reset()
    return out


def table(result: dict) -> str:
    lines = []
    for size, r in result["sizes"].items():
        names = list(r["info"])
        lines.append(f"\nViT-{size[0].upper()}/16 ({'quick smoke run' if result['meta']['quick'] else 'full'})")
        head = f"{'':28s}" + "".join(f"{n:>14s}" for n in names)
        lines.append(head)
        lines.append(f"{'params (M)':28s}" + "".join(f"{r['info'][n]['params'] / 1e6:14.2f}" for n in names))
        lines.append(f"{'GFLOPs (batch 1)':28s}" + "".join(f"{r['info'][n]['flops'] / 1e9:14.2f}" for n in names))
        lines.append(f"{'FLOPs / timm':28s}" + "".join(f"{r['info'][n]['flops_ratio']:14.3f}" for n in names))
        errs = "".join(f"{r['info'][n]['invariance_fp32']:14.1e}" for n in names)
        lines.append(f"{'fp32 invariance err':28s}{errs}")
        for f in r["forward"]:
            label = f"fwd t={f['threads']} b={f['batch']} (load {f['load'][0]:.1f})"
            cells = "".join(
                f"{f['models'][n]['ratio']:8.3f}x{f['models'][n]['median_ms']:5.0f}"[-14:].rjust(14) for n in names
            )
            lines.append(f"{label:28s}{cells}")
        if r["training"] is not None:
            t = r["training"]
            lines.append(
                f"{'train b=' + str(t['batch']) + ' (load ' + format(t['load'][0], '.1f') + ')':28s}"
                + "".join(f"{t['models'][n]['ratio']:13.3f}x" for n in names)
            )
            lines.append(
                f"{'train allocated MiB (/timm)':28s}"
                + "".join(
                    f"{m['peak_allocated_mb']:7.0f} ({m['peak_allocated_ratio']:.2f})".rjust(14)
                    for m in (t["models"][n] for n in names)
                )
            )
            lines.append(
                f"{'train total MiB (/timm)':28s}"
                + "".join(
                    f"{m['training_memory_mb']:7.0f} ({m['training_memory_ratio']:.2f})".rjust(14)
                    for m in (t["models"][n] for n in names)
                )
            )
            compiled = t.get("compiled")
            if compiled is not None:
                timed = compiled["models"]
                cells = "".join(
                    f"{timed[n]['ratio']:13.3f}x" if "ratio" in timed[n] else "failed".rjust(14) for n in names
                )
                lines.append(f"{'compiled train (load ' + format(compiled['load'][0], '.1f') + ')':28s}{cells}")
                lines.append(
                    f"{'compile + first step s':28s}"
                    + "".join(f"{timed[n].get('first_call_s', float('nan')):14.0f}" for n in names)
                )
                lines += [f"  {n} did not compile: {m['error']}" for n, m in timed.items() if "error" in m]
        for label, rows in r.get("profiles", {}).items():
            lines.append(f"\nprofile, folded {label}, 1 thread (self ms per forward, share):")
            lines += [
                f"  {row['op'][:58]:58s} {row['calls']:5d} calls {row['self_ms']:8.2f} ms {row['share']:6.1%}"
                for row in rows
            ]
    lines.append("\nratio = median per-round time ratio to timm (cells: ratio x median ms); 1 = timm's time")
    for s in result["meta"]["skipped"]:
        lines.append(f"skipped {s}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["small", "base"], choices=sorted(SIZES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved forward rounds")
    # 7: with 3 rounds the per-round ratios of one ViT-S run spread 0.43-0.50 and the median moved between runs
    parser.add_argument("--train-rounds", type=int, default=7, help="interleaved training-step rounds")
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--no-train", action="store_true", help="skip the training step")
    parser.add_argument(
        "--compile-train", action="store_true", help="also time the training step under torch.compile (minutes)"
    )
    parser.add_argument("--profile", action="store_true", help="top operators of the folded eqvit_d4 forward")
    parser.add_argument(
        "--models", nargs="+", default=list(MODELS[1:]), choices=MODELS[1:], help="rows beside timm (always timed)"
    )
    default_octic = None if OCTIC_DEFAULT is None else str(OCTIC_DEFAULT)
    parser.add_argument("--octic", default=default_octic, help="folder of the octic_vits package")
    parser.add_argument("--no-octic", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: depth 2, 64^2 images, batch 1, 1 thread")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.depth, args.img_size = 12, 224
    if args.quick:
        args.depth, args.img_size, args.batches, args.threads = 2, 64, [1], [1]
        args.rounds, args.train_rounds, args.train_batch = 2, 1, 2
    if args.compile_train and args.no_train:
        parser.error("--compile-train times the training step, which --no-train skips: pass one of them")
    if min(args.batches + args.threads + [args.rounds, args.train_rounds, args.train_batch]) < 1:
        parser.error("batches, threads, rounds and the training batch must be positive")
    out = Path(args.out) if args.out else results_dir() / "scale_speed.json"
    result = run(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
