"""Data efficiency of O(2)-subgroup ViTs on rotated MNIST (the seed's Figure 4, on MNIST).

A thin driver: the benchmark is :mod:`eqvit.bench.o2_data_efficiency`
(also ``eqvit bench o2_data_efficiency``, from an installed wheel too).
"""

from eqvit.bench.o2_data_efficiency import main

if __name__ == "__main__":
    main()
