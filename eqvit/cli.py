"""Command line interface: ``eqvit`` / ``python -m eqvit``."""

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eqvit", description="Group-equivariant Vision Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("groups", help="table of the finite groups and their irreps")
    p.add_argument("names", nargs="*", help="group names (default: C1..C6, D1..D6, T, O, I)")
    p.set_defaults(func=_cmd_groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"eqvit: error: {err}", file=sys.stderr)
        return 2
