"""Weight noise for the tests: :func:`eqvit.testing.randomise_parameters_` under the tests' short name."""

from __future__ import annotations

from eqvit.testing import randomise_parameters_ as randomise_

__all__ = ["randomise_"]
