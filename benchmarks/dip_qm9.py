"""DiP molecule generation on QM9 at an equal CPU budget: trivial frames against tetrahedral frames.

A thin driver: the benchmark is :mod:`eqvit.bench.dip_qm9` (also ``eqvit bench dip_qm9``).
"""

from eqvit.bench.dip_qm9 import main

if __name__ == "__main__":
    main()
