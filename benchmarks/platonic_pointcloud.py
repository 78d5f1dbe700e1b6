"""Platonic Transformer frames on synthetic point clouds: accuracy under random SO(3) test rotations.

A thin driver: the benchmark is :mod:`eqvit.bench.platonic_pointcloud`
(also ``eqvit bench platonic_pointcloud``, from an installed wheel too).
"""

from eqvit.bench.platonic_pointcloud import main

if __name__ == "__main__":
    main()
