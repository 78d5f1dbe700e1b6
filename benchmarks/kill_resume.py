"""kill -9, SIGINT and SIGTERM of a real ``eqvit train`` at random moments, then ``--resume``: exact or not.

A thin driver: the benchmark is :mod:`eqvit.bench.kill_resume`
(also ``eqvit bench kill_resume``, from an installed wheel too). Exit status 1 when a try is not exact.
"""

from eqvit.bench.kill_resume import main

if __name__ == "__main__":
    raise SystemExit(main())
