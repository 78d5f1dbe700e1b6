"""QM9 property regression at an equal CPU budget: trivial, T, O, I frames and a plain transformer.

A thin driver: the benchmark is :mod:`eqvit.bench.qm9` (also ``eqvit bench qm9``).
"""

from eqvit.bench.qm9 import main

if __name__ == "__main__":
    main()
