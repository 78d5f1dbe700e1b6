"""Platonic Transformer forward time against a timm ViT of equal |G|·C width and token count.

A thin driver: the benchmark is :mod:`eqvit.bench.platonic_speed`
(also ``eqvit bench platonic_speed``, from an installed wheel too).
"""

from eqvit.bench.platonic_speed import main

if __name__ == "__main__":
    main()
