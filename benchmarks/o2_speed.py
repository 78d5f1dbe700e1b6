"""Forward time, parameters and FLOPs of the D4 square O(2)-subgroup ViT against a timm ViT.

A thin driver: the benchmark is :mod:`eqvit.bench.o2_speed`
(also ``eqvit bench o2_speed``, from an installed wheel too).
"""

from eqvit.bench.o2_speed import main

if __name__ == "__main__":
    main()
