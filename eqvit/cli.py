"""Command line interface: ``eqvit`` / ``python -m eqvit``.

Every user error (bad config, unknown model, corrupt checkpoint, an output path that cannot be
written) ends with a one-paragraph message and exit code 2, never a traceback. ``train`` stopped by
SIGINT (Ctrl-C), SIGTERM or SIGHUP writes the checkpoint of its last completed step and exits with
the shell's code for the signal (130, 143, 129); an error in a training step writes that checkpoint
too before it is reported. ``eval`` exits 1 when the model's metrics are not finite (a diverged
model; ``--json`` writes them as null).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import signal
import sys


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _path(text: str) -> str:
    """A path argument: any text but the empty one (which would silently mean the current folder or a default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


# ``eqvit groups`` lists subgroups up to conjugacy, which takes tens of seconds beyond this order.
MAX_TABLE_ORDER = 240


def _table_order(name: str) -> int | None:
    """The order of the built-in group ``name`` without building it (None for another name)."""
    import re

    match = re.fullmatch(r"([CD])([1-9]\d*)", name)
    if match is not None:
        return int(match.group(2)) * (1 if match.group(1) == "C" else 2)
    return {"T": 12, "O": 24, "I": 60, "trivial": 1}.get(name)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _cmd_groups(args: argparse.Namespace) -> int:
    from eqvit.groups import get_group, list_groups

    names = args.names or list_groups(max_n=6)
    for name in names:
        order = _table_order(name)
        if order is not None and order > MAX_TABLE_ORDER:
            raise ValueError(
                f"eqvit groups tabulates groups of order <= {MAX_TABLE_ORDER} (their subgroups up to conjugacy take "
                f"minutes beyond); {name} has order {order}. Use eqvit.groups.get_group({name!r}) in Python for "
                "its elements and irreps"
            )
    print(f"{'group':<7} {'order':>5} {'d':>2}  {'classes':>7} {'subgroups':>9}  irreps (name:dim[type])")
    for name in names:
        G = get_group(name)
        irreps = " ".join(f"{r.name}:{r.dim}{'c' if r.type == 'complex' else ''}" for r in G.irreps)
        print(f"{G.name:<7} {G.order:>5} {G.dim:>2}  {len(G.conjugacy_classes):>7} {len(G.subgroups()):>9}  {irreps}")
    print("(c = complex type; subgroups counted up to conjugacy)")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    import eqvit

    for name in eqvit.list_models(args.pattern):
        print(name)
    return 0


def _export_onnx(checkpoint: str, out: str, overwrite: bool) -> int:
    """The checkpoint's model, folded for inference (``eqvit.fold``), as an ONNX file with a free batch size,
    verified in onnxruntime against eager PyTorch."""
    import eqvit
    from eqvit.deploy import export_onnx, require_onnx
    from eqvit.train.checkpoint import check_export_target, load_checkpoint, recorded_model

    require_onnx()  # before the checkpoint is read
    _, sidecar = load_checkpoint(checkpoint)
    config = recorded_model(sidecar, checkpoint)
    if "name" not in config:
        raise ValueError(f"checkpoint {checkpoint} records no model name (config.model.name) to build its model from")
    check_export_target(checkpoint, out, overwrite)
    model = eqvit.create_model(config["name"], checkpoint_path=checkpoint, **(config.get("kwargs") or {}))
    err = export_onnx(eqvit.fold(model), out)
    print(f"wrote {out} ({config['name']}, batch size free; onnxruntime matches PyTorch to {err:.1e} relative)")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import eqvit

    model = eqvit.create_model(args.model)
    params = sum(p.numel() for p in model.parameters())
    group = getattr(model, "group", None)
    domain = getattr(model, "domain", None)
    print(f"model        {args.model} ({type(model).__name__})")
    print(f"parameters   {params:,} ({params / 1e6:.2f}M)")
    print(f"group        {group.name + f' (order {group.order})' if group is not None else 'none (not equivariant)'}")
    if domain is not None:
        print(f"input        {domain.describe_input(model.in_chans)}")
    print(f"output       {getattr(model, 'out_chans', '?')} channels ({getattr(model, 'output_action', 'same')})")
    for key, value in sorted(getattr(model, "config", {}).items()):
        print(f"  {key:<20} {value}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from eqvit.train.config import load_config
    from eqvit.train.engine import train

    config = load_config(args.config)
    if args.checkpoint_every is not None:
        config.train.checkpoint_every = args.checkpoint_every
    if args.device is not None:
        config.train.device = args.device
    if args.amp:
        config.train.amp = True
    if args.compile:
        config.train.compile = True
    summary = train(
        config,
        out_dir=args.out,
        max_steps=args.max_steps,
        max_minutes=args.max_minutes,
        resume=args.resume,
        overwrite=args.overwrite,
    )
    if summary["steps"] == 0:
        print("eqvit: error: no training step was run", file=sys.stderr)
        return 1
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from eqvit import bench

    if args.name is None:
        width = max(map(len, bench.BENCHMARKS))
        for name in bench.list_benchmarks():
            print(f"{name:<{width}}  {bench.BENCHMARKS[name]}")
        print("run one with: eqvit bench NAME [args] (NAME --help for its options)")
        return 0
    bench.load(args.name)  # an unknown name is a ValueError listing the valid ones, before anything runs
    result = bench.run(args.name, args.bench_args)
    return result if isinstance(result, int) else 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from eqvit.models.zoo import zoo_markdown, zoo_rows, zoo_text

    rows = zoo_rows(args.pattern)
    print(zoo_markdown(rows) if args.markdown else zoo_text(rows))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from eqvit.train.checkpoint import check_output_file
    from eqvit.train.config import load_config
    from eqvit.train.engine import evaluate_checkpoint

    if args.rollout is not None:
        from eqvit.train.rollout import MAX_STEPS

        if args.rollout > MAX_STEPS:  # found before the checkpoint and the validation set are loaded
            raise ValueError(f"--rollout: expected at most {MAX_STEPS} steps, got {args.rollout}")
    config = load_config(args.config)
    if args.rollout is not None:
        from eqvit.train.rollout import rollout_checkpoint

        if args.out is None or args.json:
            raise ValueError("--rollout N writes OUT/rollout.json and OUT/rollout.png: give --out DIR (not --json)")
        rollout_checkpoint(config, args.checkpoint, args.rollout, args.out)
        return 0
    if args.json:  # found before the evaluation, not after it
        check_output_file(args.json, "--json")
    result = evaluate_checkpoint(config, args.checkpoint)
    bad = _non_finite(result)
    if bad:
        print(
            f"eqvit: warning: the model's metrics are not finite ({', '.join(bad[:6])}): it has diverged"
            f"{'; they are written as null' if args.json else ''}",
            file=sys.stderr,
        )
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(_finite_or_null(result), indent=2, allow_nan=False))
        print(f"wrote {args.json}")
    return 1 if bad else 0


def _non_finite(value, where: str = "") -> list[str]:
    """``["metrics.rel_l2", ...]``: where ``value`` (nested dicts and lists) holds a NaN or an infinity."""
    import math

    if isinstance(value, float):
        return [] if math.isfinite(value) else [where or "value"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _non_finite(v, f"{where}[{i}]")]
    return []


def _finite_or_null(value):
    """``value`` with every NaN and infinity replaced by None (JSON has no NaN)."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def _cmd_sample(args: argparse.Namespace) -> int:
    from eqvit.chem.rdkit_mols import require_gen
    from eqvit.train.config import load_config
    from eqvit.train.sample import sample_checkpoint

    require_gen("eqvit sample")  # before the config and the checkpoint are read
    config = load_config(args.config)
    sample_checkpoint(config, args.checkpoint, args.num, args.out, seed=args.seed, steps=args.steps)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from eqvit.train.checkpoint import export_weights, recorded_model

    if Path(args.out).suffix == ".onnx":
        return _export_onnx(args.checkpoint, args.out, args.overwrite)
    out, sidecar = export_weights(args.checkpoint, args.out, overwrite=args.overwrite)
    model = recorded_model(sidecar, args.checkpoint)
    name, kwargs = model.get("name", "<model name>"), model.get("kwargs") or {}
    extra = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    print(f"wrote {out} (the model's state dict, step {sidecar.get('step', '?')})")
    if sidecar.get("relaxed"):
        print(
            f"the run was restricted to {' -> '.join(sidecar['relaxed'])}: load it with "
            f"eqvit.create_model({name!r}{extra}, checkpoint_path={str(out)!r}), which restricts the model first"
        )
    else:
        print(f"load it with: import eqvit, timm; timm.create_model({name!r}{extra}, checkpoint_path={str(out)!r})")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    import eqvit
    from eqvit.testing import EquivarianceError, assert_equivariant

    model = eqvit.create_model(args.model)
    try:
        print(assert_equivariant(model))
    except EquivarianceError as err:
        print(err)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eqvit", description="Group-equivariant Vision Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("groups", help="table of the finite groups and their irreps")
    p.add_argument("names", nargs="*", help="group names (default: C1..C6, D1..D6, T, O, I)")
    p.set_defaults(func=_cmd_groups)

    p = sub.add_parser("list", help="registered models")
    p.add_argument("pattern", nargs="?", default="*", help="fnmatch pattern, e.g. 'so3vit*'")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("zoo", help="table of the registered models (family, group, params, input)")
    p.add_argument("pattern", nargs="?", default="*", help="fnmatch pattern, e.g. 'platonic*'")
    p.add_argument("--markdown", action="store_true", help="a markdown table (the README's model table)")
    p.set_defaults(func=_cmd_zoo)

    p = sub.add_parser("train", help="train from a YAML config")
    p.add_argument("config", type=_path, help="YAML experiment config, e.g. configs/o2vit_rotmnist.yaml")
    p.add_argument("--out", type=_path, help="output folder (default: train.out of the config)")
    p.add_argument("--max-steps", type=_int_at_least(1), help="stop after N >= 1 steps")
    p.add_argument("--max-minutes", type=_positive_float, help="stop after M > 0 minutes of training")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from OUT/last.safetensors if present")
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in an OUT that already holds a run (replaces its checkpoint)",
    )
    p.add_argument(
        "--checkpoint-every", type=_int_at_least(0), help="write a checkpoint every N steps (0: only at the end)"
    )
    p.add_argument("--device", choices=["cpu", "cuda"], help="override train.device")
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "eval",
        help="score a checkpoint on the validation set (exit 1 when the metrics are not finite)",
        description="Score a checkpoint on the validation set. Exit code 0; 1 when the model's metrics are not "
        "finite (a diverged model; --json writes them as null); 2 on a user error.",
    )
    p.add_argument("config", type=_path)
    p.add_argument("--checkpoint", type=_path, required=True, help="path to last.safetensors")
    p.add_argument("--json", type=_path, help="also write the metrics to this JSON file")
    p.add_argument(
        "--rollout",
        type=_int_at_least(1),
        metavar="N",
        help="shallow water: feed the model its own predictions N steps",
    )
    p.add_argument("--out", type=_path, help="with --rollout: folder for rollout.json and rollout.png")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("sample", help="sample molecules from a generative checkpoint and score them (gen extra)")
    p.add_argument(
        "config", type=_path, help="YAML experiment config with data.name qm9_generation, e.g. configs/dip_qm9.yaml"
    )
    p.add_argument("--checkpoint", type=_path, required=True, help="path to best.safetensors or last.safetensors")
    p.add_argument("--num", type=_int_at_least(1), default=1000, help="molecules to sample (default 1000)")
    p.add_argument(
        "--out", type=_path, required=True, help="folder for samples.sdf, samples.xyz, metrics.json, molecules.png"
    )
    p.add_argument("--seed", type=_int_at_least(0), default=0, help="seed of the atom counts and the noise")
    p.add_argument("--steps", type=_int_at_least(1), help="sampling steps (default: data.diffusion.steps)")
    p.set_defaults(func=_cmd_sample)

    p = sub.add_parser(
        "export", help="write a checkpoint's model as a plain state dict (.safetensors, for timm) or as ONNX (.onnx)"
    )
    p.add_argument("checkpoint", type=_path, help="path to last.safetensors")
    p.add_argument(
        "out",
        type=_path,
        help="OUT.safetensors: the state dict, load it with timm.create_model(name, checkpoint_path=OUT); "
        "OUT.onnx: the inference form with a free batch size, checked in onnxruntime (onnx extra); never the "
        "checkpoint itself",
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("info", help="parameters, group, input shape and defaults of a model")
    p.add_argument("model")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("bench", help="list the benchmarks, or run one (extra arguments are passed on)")
    p.add_argument("name", nargs="?", help="benchmark name, e.g. so3vit_vs_s2transformer (none: list them)")
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("check", help="run assert_equivariant on a registered model")
    p.add_argument("model")
    p.set_defaults(func=_cmd_check)
    return parser


def _one_paragraph(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _with_notes(text: str, err: BaseException) -> str:
    """``text`` followed by the notes the engine added to ``err`` (where the last checkpoint is)."""
    notes = [str(n) for n in getattr(err, "__notes__", ())]
    return _one_paragraph("; ".join([text.rstrip(". "), *notes]) if notes else text)


def _describe_os_error(err: OSError) -> str:
    reason = err.strerror or str(err)
    where = " ".join(f"'{f}'" for f in (err.filename, err.filename2) if f is not None)
    hints = {
        errno.ENOSPC: "free some space or choose another output folder",
        errno.EACCES: "choose a folder you can write to",
        errno.EPERM: "choose a folder you can write to",
        errno.EROFS: "choose a folder on a writable file system",
        errno.ENOTDIR: "a part of the path is a file, not a folder",
        errno.EISDIR: "give a file name, not a folder",
        errno.ENOENT: "check the path",
    }
    hint = hints.get(err.errno)
    return _one_paragraph(f"{reason}{': ' + where if where else ''}{'; ' + hint if hint else ''}")


def reference_markdown() -> str:
    """``docs/cli.md``: every command's usage and options, from the parser itself."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = [
        "# Command line",
        "",
        "`eqvit COMMAND` or `python -m eqvit COMMAND`; generated from the parser "
        "(`eqvit.cli.reference_markdown()`). A user error ends with one paragraph on stderr and exit code 2.",
        "",
    ]
    for name, command in sub.choices.items():
        width = 100  # not the terminal's: the page is the same wherever it is generated
        command.formatter_class = lambda prog, cls=command.formatter_class, width=width: cls(prog, width=width)
        help_text = command.format_help().replace(parser.prog + " ", "eqvit ", 1)
        lines += [f"## eqvit {name}", "", "```text", help_text.rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from eqvit.train.signals import stop_signals

    parser = build_parser()
    args = parser.parse_args(argv)
    # train: SIGTERM and SIGHUP save a checkpoint as Ctrl-C does. The messages below are printed with the
    # signals still caught, so a second one cannot cut them; run as the process's own command line
    # (argv None), a stop leaves them ignored for the exit that follows.
    with stop_signals(exit_after=argv is None) if args.func is _cmd_train else contextlib.nullcontext():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """``args.func(args)``, with every user error as one paragraph on stderr and its exit code."""
    from eqvit.train.checkpoint import CheckpointError
    from eqvit.train.config import ConfigError

    try:
        return args.func(args)
    except (ConfigError, CheckpointError, ValueError, FloatingPointError) as err:
        print(f"eqvit: error: {_with_notes(str(err), err)}", file=sys.stderr)
        return 2
    except OSError as err:  # a path that cannot be read or written: permissions, a full disk, a file for a folder
        print(f"eqvit: error: {_with_notes(_describe_os_error(err), err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM / SIGHUP (eqvit.train.signals.Interrupted)
        signum = getattr(err, "signum", signal.SIGINT)
        notes = "".join(f"; {note}" for note in getattr(err, "__notes__", ()))
        print(f"eqvit: interrupted by {signal.Signals(signum).name}{notes}", file=sys.stderr)
        return 128 + signum
