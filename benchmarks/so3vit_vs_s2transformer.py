"""SO3ViT vs the S2Transformer baseline: forward time, peak training memory, parameters.

A thin driver: the benchmark is :mod:`eqvit.bench.so3vit_vs_s2transformer`
(also ``eqvit bench so3vit_vs_s2transformer``, from an installed wheel too).
"""

from eqvit.bench.so3vit_vs_s2transformer import main

if __name__ == "__main__":
    main()
