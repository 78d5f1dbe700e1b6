"""Command line interface: ``eqvit`` / ``python -m eqvit``.

Every user error (bad config, unknown model, corrupt checkpoint) ends with a one-paragraph
message and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys


def _cmd_groups(args: argparse.Namespace) -> int:
    from eqvit.groups import get_group, list_groups

    names = args.names or list_groups(max_n=6)
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
        config, out_dir=args.out, max_steps=args.max_steps, max_minutes=args.max_minutes, resume=args.resume
    )
    return 0 if summary["steps"] > 0 else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    scripts = sorted(p.stem for p in folder.glob("*.py")) if folder.is_dir() else []
    if args.name not in scripts:
        from eqvit.utils import unknown_name_error

        raise unknown_name_error(f"benchmark (in {folder})", args.name, scripts)
    sys.argv = [str(folder / f"{args.name}.py"), *args.bench_args]
    runpy.run_path(str(folder / f"{args.name}.py"), run_name="__main__")
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from eqvit.models.zoo import zoo_markdown, zoo_rows

    print(zoo_markdown(zoo_rows(args.pattern)))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from eqvit.train.config import load_config
    from eqvit.train.engine import evaluate_checkpoint

    result = evaluate_checkpoint(load_config(args.config), args.checkpoint)
    if args.json:
        import json
        from pathlib import Path

        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
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

    p = sub.add_parser("zoo", help="markdown table of the registered models (family, group, params, input)")
    p.add_argument("pattern", nargs="?", default="*", help="fnmatch pattern, e.g. 'platonic*'")
    p.set_defaults(func=_cmd_zoo)

    p = sub.add_parser("train", help="train from a YAML config")
    p.add_argument("config", help="YAML experiment config, e.g. configs/o2vit_rotmnist.yaml")
    p.add_argument("--out", help="output folder (default: train.out of the config)")
    p.add_argument("--max-steps", type=int, help="stop after N steps")
    p.add_argument("--max-minutes", type=float, help="stop after M minutes of training")
    p.add_argument("--resume", action="store_true", help="continue from OUT/last.safetensors if present")
    p.add_argument("--checkpoint-every", type=int, help="write a checkpoint every N steps")
    p.add_argument("--device", choices=["cpu", "cuda"], help="override train.device")
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="score a checkpoint on the validation set")
    p.add_argument("config")
    p.add_argument("--checkpoint", required=True, help="path to last.safetensors")
    p.add_argument("--json", help="also write the metrics to this JSON file")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("info", help="parameters, group, input shape and defaults of a model")
    p.add_argument("model")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("bench", help="run a script from benchmarks/ (extra arguments are passed on)")
    p.add_argument("name", help="benchmark name, e.g. so3vit_vs_s2transformer")
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("check", help="run assert_equivariant on a registered model")
    p.add_argument("model")
    p.set_defaults(func=_cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    from eqvit.train.checkpoint import CheckpointError
    from eqvit.train.config import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, CheckpointError, ValueError, FileNotFoundError, FloatingPointError) as err:
        print(f"eqvit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eqvit: interrupted (a checkpoint was written if training had started)", file=sys.stderr)
        return 130
