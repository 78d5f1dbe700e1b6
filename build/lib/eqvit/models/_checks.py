"""Checks of the size arguments shared by the model builders: a ValueError naming the argument, what is
valid and what came, before any layer is built (instead of a ZeroDivisionError or a torch message).

Every builder calls :func:`check_model_args` with its keyword arguments; it checks the ones it knows
(``depth``, ``num_heads``, ``in_chans``, ...) and leaves the rest to the builder.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Mapping
from typing import Any


def _integer(value: Any) -> int | None:
    """``value`` as an int if it is an integer (Python or numpy, not a bool or a float), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _real(value: Any) -> float | None:
    """``value`` as a float if it is a finite real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def positive_int(name: str, value: Any, what: str = "") -> int:
    """``value`` if it is an integer >= 1, else a ValueError naming ``name``."""
    number = _integer(value)
    if number is None or number < 1:
        raise ValueError(f"expected {name} to be a positive integer{what}, got {value!r}")
    return number


def non_negative_int(name: str, value: Any, what: str = "") -> int:
    number = _integer(value)
    if number is None or number < 0:
        raise ValueError(f"expected {name} to be a non-negative integer{what}, got {value!r}")
    return number


def positive_real(name: str, value: Any, what: str = "") -> float:
    number = _real(value)
    if number is None or number <= 0:
        raise ValueError(f"expected {name} to be a positive number{what}, got {value!r}")
    return number


def probability(name: str, value: Any) -> float:
    number = _real(value)
    if number is None or not 0 <= number < 1:
        raise ValueError(f"expected {name} to be a probability in [0, 1), got {value!r}")
    return number


# argument -> (check, what it means); None values mean "the default" and are not checked.
_RULES: dict[str, tuple[Callable[[str, Any, str], Any], str]] = {
    "depth": (positive_int, " (the number of blocks)"),
    "num_heads": (positive_int, " (attention heads)"),
    "in_chans": (positive_int, " (input channels)"),
    "out_chans": (positive_int, " (output channels)"),
    "num_classes": (non_negative_int, " (0 for no classifier)"),
    "embed_dim": (positive_int, " (the token width)"),
    "target_width": (positive_int, " (the token width to approach)"),
    "regular_copies": (positive_int, " (copies of the regular representation)"),
    "mlp_ratio": (positive_real, " (MLP width / token width)"),
    "img_size": (positive_int, " (the image side in pixels)"),
    "patch_size": (positive_int, " (the patch side in pixels)"),
    "n_patch_side": (positive_int, ""),
    "n_pixel_side": (positive_int, ""),
    "input_level": (non_negative_int, " (the icosphere level of the input)"),
    "patch_level": (non_negative_int, " (the icosphere level of the patches)"),
    "latitude_degree": (positive_int, " (Legendre polynomials of the latitude encoding)"),
    "num_points": (positive_int, " (points per random cloud)"),
    "scale_factor": (positive_int, " (the encoder's downsampling)"),
    "theta_cutoff": (positive_real, " (the attention disk radius in radians)"),
}
_RATES = ("drop_rate", "attn_drop_rate", "drop_path_rate", "head_drop_rate", "proj_drop_rate", "pos_drop_rate")


def check_model_args(args: Mapping[str, Any]) -> None:
    """ValueError for the first size argument in ``args`` that is out of range (``None`` means the default)."""
    for name, value in args.items():
        if value is None:
            continue
        if name in _RULES:
            check, what = _RULES[name]
            if name == "img_size" and isinstance(value, (tuple, list)):
                if len(value) != 2:
                    raise ValueError(f"expected img_size to be an int or a pair (height, width), got {value!r}")
                for side in value:
                    positive_int("img_size", side, " (each side in pixels)")
                continue
            check(name, value, what)
        elif name in _RATES:
            probability(name, value)
