"""The SO(3)-RoPE seed's Table 1 on shallow water at the seed's own budget.

A thin driver: the benchmark is :mod:`eqvit.bench.swe_table1`
(also ``eqvit bench swe_table1``, from an installed wheel too).
"""

from eqvit.bench.swe_table1 import main

if __name__ == "__main__":
    main()
