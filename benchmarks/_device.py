"""The device and the flash-attention SDPA check as JSON (the helpers are package code now).

A thin driver: the benchmark is :mod:`eqvit.bench.device`
(also ``eqvit bench device``, from an installed wheel too).
"""

from eqvit.bench.device import main

if __name__ == "__main__":
    main()
