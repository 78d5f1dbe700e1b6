"""torch.compile (Inductor) against eager for every registered family: time, graph breaks, first call.

A thin driver: the benchmark is :mod:`eqvit.bench.compile`.
"""

from eqvit.bench.compile import main

if __name__ == "__main__":
    main()
