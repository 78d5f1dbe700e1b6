"""The SO(3)-RoPE seed's grid over depth, heads and width: SO3ViT error against time per epoch.

A thin driver: the benchmark is :mod:`eqvit.bench.so3vit_sweep`
(also ``eqvit bench so3vit_sweep``, from an installed wheel too).
"""

from eqvit.bench.so3vit_sweep import main

if __name__ == "__main__":
    main()
