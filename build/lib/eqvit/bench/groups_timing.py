"""Cold construction time of the Platonic groups (each measurement in a fresh interpreter).

Measures: I with its irreps, O with its subgroups up to conjugacy, and both with
everything (Cayley table, classes, irreps, subgroups, regular representation). Writes JSON
and prints a table. Usage: ``python benchmarks/groups_timing.py [--repeats 5] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from eqvit.bench._paths import results_dir

SNIPPETS = {
    "I: elements + irreps": "G = icosahedral(); G.irreps",
    "O: elements + subgroups": "G = octahedral(); G.subgroups()",
    "I: irreps + subgroups + regular rep": "G = icosahedral(); G.irreps; G.subgroups(); G.regular_representation",
    "O: irreps + subgroups + regular rep": "G = octahedral(); G.irreps; G.subgroups(); G.regular_representation",
}

TEMPLATE = """
import time
from eqvit.groups.platonic import icosahedral, octahedral
start = time.perf_counter()
{snippet}
print(time.perf_counter() - start)
"""


def measure(snippet: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", TEMPLATE.format(snippet=snippet)], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(results_dir() / "groups_timing.json"))
    args = parser.parse_args()
    results = {}
    for _ in range(args.repeats):  # interleaved rounds
        for name, snippet in SNIPPETS.items():
            results.setdefault(name, []).append(measure(snippet))
    print(f"{'cold construction (fresh process)':<40} {'median ms':>10} {'min ms':>8}")
    for name, times in results.items():
        print(f"{name:<40} {1e3 * statistics.median(times):>10.1f} {1e3 * min(times):>8.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"machine": platform.platform(), "python": platform.python_version(), "seconds": results}, indent=2)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
