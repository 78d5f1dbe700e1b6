"""Time the real Wigner-D matrices of eqvit.groups.so3 on a batch of random poses.

A thin driver: the benchmark is :mod:`eqvit.bench.wigner_timing`
(also ``eqvit bench wigner_timing``, from an installed wheel too).
"""

from eqvit.bench.wigner_timing import main

if __name__ == "__main__":
    main()
