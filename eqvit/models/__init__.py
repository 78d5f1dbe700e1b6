"""Registered models. Importing this package registers every family (in timm's registry too)."""

from eqvit.models import (
    baselines,  # noqa: F401
    dip,  # noqa: F401  (DiP denoisers, after molecules whose attention they use)
    molecules,  # noqa: F401
    o2vit,  # noqa: F401
    platonic,  # noqa: F401
    scale,  # noqa: F401  (ViT-S/B-sized models, after the families they build on)
    so3vit,  # noqa: F401  (registers the SO3ViT family)
)
from eqvit.models._registry import create_model, is_model, list_models, register_model
from eqvit.models.vit import EquivariantViT

__all__ = ["EquivariantViT", "create_model", "is_model", "list_models", "register_model"]
