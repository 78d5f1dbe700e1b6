"""Can the Platonic image classifiers fit? Training loss on a few digits, per frame-pooling head.

A thin driver: the benchmark is :mod:`eqvit.bench.platonic_head_fit`
(also ``eqvit bench platonic_head_fit``, from an installed wheel too).
"""

from eqvit.bench.platonic_head_fit import main

if __name__ == "__main__":
    main()
