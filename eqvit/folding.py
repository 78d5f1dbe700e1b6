"""``eqvit.fold(model)``: the inference form of a model, each layer folded by itself.

A training forward derives its weights from the parameters on every call (slab matrices of the Schur
linears, dense matrices of the others, tiled affines, turned kernels, positional encodings) and keeps no
cache that could go stale. A layer that can fix them offers ``fold()``, which returns a module with the
same ``in_type``, ``out_type`` and forward signature computing the same function (timm's
``reparameterize_model`` idiom); :func:`fold` walks a copy of the model and calls it, outermost first.
Nothing here knows a model's type: a layer without ``fold()`` is kept and its children are folded.

The folded model has the public interface of the unfolded one (``forward_features``,
``forward_intermediates``, ``forward_head`` return what they return unfolded), no trainable parameters,
and is meant for ``eval()`` / ``no_grad`` use; train the original and fold again after an update.
"""

from __future__ import annotations

import copy
import types

import torch
from torch import nn


def _fold_method(module: nn.Module):
    """The module's ``fold`` when its class defines one as a method (a child module named ``fold`` is not)."""
    method = getattr(type(module), "fold", None)
    return module.fold if isinstance(method, types.FunctionType) else None


def fold_modules(module: nn.Module) -> nn.Module:
    """Fold ``module`` (its ``fold()``, if any), then every child of the result, in place; returns the result."""
    fold = _fold_method(module)
    if fold is not None:
        module = fold()
    for name, child in list(module.named_children()):
        folded = fold_modules(child)
        if folded is not child:
            setattr(module, name, folded)
    return module


def fold(model: nn.Module) -> nn.Module:
    """The inference form of ``model``: a folded copy in ``eval()`` mode computing the same function.

    Works on every registered model and on any module built from eqvit layers; ``model`` itself is left
    as it is.
    """
    folded = copy.deepcopy(model).eval()
    with torch.no_grad():
        folded = fold_modules(folded)
    return folded.requires_grad_(False)
