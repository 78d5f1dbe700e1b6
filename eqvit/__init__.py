"""eqvit: group-equivariant Vision Transformers for PyTorch."""

from eqvit import groups

__version__ = "0.1.0"

__all__ = ["__version__", "groups"]
