"""docs/benchmarks.md from the canonical results: a thin driver of :mod:`eqvit.bench.report` (also ``eqvit bench
report``)."""

from eqvit.bench.report import main

if __name__ == "__main__":
    raise SystemExit(main())
