"""Cross-group ablations, one command each: ``python benchmarks/ablate.py TASK [--quick]``.

A thin driver: the benchmark is :mod:`eqvit.bench.ablate`
(also ``eqvit bench ablate``, from an installed wheel too).
"""

from eqvit.bench.ablate import main

if __name__ == "__main__":
    main()
