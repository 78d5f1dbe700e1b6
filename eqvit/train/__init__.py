"""Training: engine, metrics, checkpoints. Submodules load on first use."""

import importlib

_LAZY = {
    "Callback": "engine",
    "ClassifierHistory": "classify",
    "EarlyStopping": "engine",
    "Task": "tasks",
    "TensorClassificationTask": "tasks",
    "Trainer": "engine",
    "fit_classifier": "classify",
    "relative_lp_error": "metrics",
    "lp_error": "metrics",
    "latlon_quadrature_weights": "metrics",
    "SphereErrorMap": "metrics",
    "polar_error_ratio": "metrics",
}

__all__ = [
    "Callback",
    "ClassifierHistory",
    "EarlyStopping",
    "SphereErrorMap",
    "Task",
    "TensorClassificationTask",
    "Trainer",
    "fit_classifier",
    "latlon_quadrature_weights",
    "lp_error",
    "polar_error_ratio",
    "relative_lp_error",
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
