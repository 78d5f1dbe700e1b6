"""``eqvit.fold`` against the training form, for every registered model.

A thin driver: the benchmark is :mod:`eqvit.bench.fold_agreement`
(also ``eqvit bench fold_agreement``, from an installed wheel too).
"""

from eqvit.bench.fold_agreement import main

if __name__ == "__main__":
    main()
