"""Equal wall-clock accuracy on shallow water: SO3ViT vs the APE ablation vs S2Transformer.

A thin driver: the benchmark is :mod:`eqvit.bench.swe_accuracy`
(also ``eqvit bench swe_accuracy``, from an installed wheel too).
"""

from eqvit.bench.swe_accuracy import main

if __name__ == "__main__":
    main()
