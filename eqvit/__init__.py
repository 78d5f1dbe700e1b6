"""eqvit: group-equivariant Vision Transformers for PyTorch.

``eqvit.create_model(name, **kwargs)`` builds a registered model; after ``import eqvit``,
``timm.create_model(name)`` builds the same one.
"""

from eqvit import deploy, groups
from eqvit.folding import fold
from eqvit.models import EquivariantViT, create_model, list_models, register_model
from eqvit.models.restrict import restrict

__version__ = "0.1.0"

__all__ = [
    "EquivariantViT",
    "__version__",
    "create_model",
    "deploy",
    "fold",
    "groups",
    "list_models",
    "register_model",
    "restrict",
]
