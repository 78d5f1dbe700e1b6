"""``eqvit.fuse`` against the training form, for every registered model.

A thin driver: the benchmark is :mod:`eqvit.bench.fuse_agreement`
(also ``eqvit bench fuse_agreement``, from an installed wheel too).
"""

from eqvit.bench.fuse_agreement import main

if __name__ == "__main__":
    main()
