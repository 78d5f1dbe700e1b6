"""Invariance and restriction errors of the O(2)-subgroup ViTs, every group and both attention layouts.

A thin driver: the benchmark is :mod:`eqvit.bench.o2_equivariance`
(also ``eqvit bench o2_equivariance``, from an installed wheel too).
"""

from eqvit.bench.o2_equivariance import main

if __name__ == "__main__":
    main()
