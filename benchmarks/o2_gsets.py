"""MLP G-sets of a D4 ViT (the O(2) seed's Sec. 5.3 / Figure 6) on rotated MNIST.

A thin driver: the benchmark is :mod:`eqvit.bench.o2_gsets`
(also ``eqvit bench o2_gsets``, from an installed wheel too).
"""

from eqvit.bench.o2_gsets import main

if __name__ == "__main__":
    main()
