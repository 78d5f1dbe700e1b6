"""ViT-S/B-scale speed, FLOPs, invariance and training cost: timm vs eqvit's Schur-layout D4 models vs octic-vits.

A thin driver: the benchmark is :mod:`eqvit.bench.scale_speed`.
"""

from eqvit.bench.scale_speed import main

if __name__ == "__main__":
    main()
