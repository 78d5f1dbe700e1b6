"""Cold construction time of the Platonic groups (each measurement in a fresh interpreter).

A thin driver: the benchmark is :mod:`eqvit.bench.groups_timing`
(also ``eqvit bench groups_timing``, from an installed wheel too).
"""

from eqvit.bench.groups_timing import main

if __name__ == "__main__":
    main()
