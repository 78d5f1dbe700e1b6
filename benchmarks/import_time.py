"""Start-up cost: ``import eqvit`` and ``eqvit list`` against ``import torch, timm``.

A thin driver: the benchmark is :mod:`eqvit.bench.import_time`
(also ``eqvit bench import_time``, from an installed wheel too).
"""

from eqvit.bench.import_time import main

if __name__ == "__main__":
    main()
