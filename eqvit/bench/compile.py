"""``torch.compile`` (Inductor) against eager for every registered family: time, graph breaks, first call.

For each model (by default the test-sized twin ``<family>_tiny`` of every registered family, else the
family's first registered name) and each form:

* ``train``: the training form, one forward + backward of a weighted sum of the output (``eval()``, so
  dropout and drop-path are off and eager and compiled compute the same function; gradients on);
* ``folded``: ``eqvit.fold(model)``, one forward under ``no_grad``.

the table gives the graph breaks ``torch._dynamo.explain`` counts, the first compiled call (tracing and
Inductor's code generation, with Inductor's on-disk caches off so that it is the cold cost), the median of
eager and compiled over ``--rounds`` interleaved rounds (:func:`~eqvit.bench.scale_speed.interleaved`, the
order rotating every round), their ratio, and the largest difference of the compiled output from eager.
The compiled model is ``torch.compile(model, fullgraph=True)``: a graph break is an error, reported in the
row. ``os.getloadavg()`` is recorded before and after each row.

Usage::

    python benchmarks/compile.py                       # every family, both forms, batch 2, 1 thread
    python benchmarks/compile.py --names o2vit_d4_small_patch16_224 vit_small_patch16_224 --forms train --batch 8

A name that is not eqvit's but timm's builds timm's model (a baseline row; its "folded" form is itself).

Writes ``benchmarks/results/compile.json`` (``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import eqvit
from eqvit.bench._paths import display_path, results_dir
from eqvit.bench.scale_speed import interleaved

DEFAULT_OUT = results_dir() / "compile.json"
FORMS = ("train", "folded")


def family_models() -> list[str]:
    """One model per registered family: ``<family>_tiny`` when registered, else the family's first name."""
    registered = set(eqvit.list_models())
    chosen = {}
    for name in sorted(registered):
        family = name.rsplit("_", 1)[0]
        tiny = f"{family}_tiny"
        chosen.setdefault(family, tiny if tiny in registered else name)
    return sorted(set(chosen.values()))


def _inputs(model: nn.Module, batch: int) -> tuple[torch.Tensor, ...]:
    """What the model's domain feeds (eqvit), or an image batch of its ``pretrained_cfg`` size (timm)."""
    gen = torch.Generator().manual_seed(0)
    if not hasattr(model, "domain"):
        return (torch.randn(batch, *model.pretrained_cfg["input_size"], generator=gen),)
    x = model.domain.random_input(batch, model.in_chans, generator=gen, dtype=torch.float32)
    return x if isinstance(x, tuple) else (x,)


def _callables(model: nn.Module, form: str, x: tuple[torch.Tensor, ...]) -> Callable[[nn.Module], torch.Tensor]:
    """``run(module) -> output``: one training-form forward + backward, or one no-grad forward."""
    if form == "folded":

        def forward(module: nn.Module) -> torch.Tensor:
            with torch.no_grad():
                return module(*x)

        return forward

    def forward_backward(module: nn.Module) -> torch.Tensor:
        out = module(*x)
        weights = torch.linspace(-1, 1, out.numel()).view_as(out)
        (out * weights).sum().backward()
        model.zero_grad(set_to_none=True)
        return out.detach()

    return forward_backward


def _build(name: str) -> nn.Module:
    """The registered model ``name`` with its default init (seeded); a timm name (not eqvit's) builds timm's
    model, for a baseline row."""
    torch.manual_seed(0)
    if name in eqvit.list_models():
        return eqvit.create_model(name)
    import timm

    return timm.create_model(name)


def measure(name: str, form: str, batch: int, rounds: int, backend: str) -> dict:
    """One row of the table (see the module docstring)."""
    model = _build(name).eval()
    if form == "folded":
        model = eqvit.fold(model)
    x = _inputs(model, batch)
    run = _callables(model, form, x)
    load = [os.getloadavg()[0]]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(*x)
    row = dict(name=name, form=form, batch=batch, graph_breaks=explained.graph_break_count)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    try:
        start = time.perf_counter()
        out = run(compiled)
        row["first_call_s"] = time.perf_counter() - start
    except Exception as error:  # the row reports what failed
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        row["load"] = load + [os.getloadavg()[0]]
        return row
    expected = run(model)
    row["max_abs_diff"] = float((out - expected).abs().max())
    times = interleaved({"eager": lambda: run(model), "compiled": lambda: run(compiled)}, rounds)
    medians = {key: statistics.median(t) for key, t in times.items()}
    row.update(eager_ms=1e3 * medians["eager"], compiled_ms=1e3 * medians["compiled"])
    row["compiled_over_eager"] = medians["compiled"] / medians["eager"]
    row["load"] = load + [os.getloadavg()[0]]
    return row


def _format(row: dict) -> str:
    head = f"{row['name']:<36} {row['form']:<5} {row['graph_breaks']:>6}"
    if "error" in row:
        return f"{head}  {row['error']}"
    return (
        f"{head} {row['first_call_s']:>9.1f} {row['eager_ms']:>9.2f} {row['compiled_ms']:>9.2f}"
        f" {row['compiled_over_eager']:>7.2f}x {row['max_abs_diff']:>9.1e}  {row['load'][0]:.2f}-{row['load'][1]:.2f}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", nargs="+", default=None, help="models (default: one per registered family)")
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    if args.batch < 1 or args.rounds < 1 or args.threads < 1:
        parser.error(
            f"--batch, --rounds and --threads must be positive, got {args.batch}, {args.rounds}, {args.threads}"
        )
    names = args.names or family_models()
    import timm

    unknown = [n for n in names if n not in eqvit.list_models() and not timm.is_model(n)]
    if unknown:
        parser.error(f"unknown model names {unknown}: neither eqvit's (see `eqvit list`) nor timm's")
    torch.set_num_threads(args.threads)
    # The first call should be the cold cost: Inductor's on-disk caches would make a rerun look free.
    torch._inductor.config.force_disable_caches = True
    print(
        f"{'model':<36} {'form':<5} {'breaks':>6} {'first s':>9} {'eager ms':>9} {'comp ms':>9} {'c/e':>8}"
        f" {'max diff':>9}  load"
    )
    rows = []
    for name in names:
        for form in args.forms:
            rows.append(measure(name, form, args.batch, args.rounds, args.backend))
            print(_format(rows[-1]), flush=True)
    result = dict(
        meta=dict(
            torch=torch.__version__,
            backend=args.backend,
            threads=args.threads,
            batch=args.batch,
            rounds=args.rounds,
            machine=platform.machine(),
            cpus=os.cpu_count(),
        ),
        rows=rows,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {display_path(out)}")
    return result


if __name__ == "__main__":
    main()
