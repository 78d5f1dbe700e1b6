"""Restriction to a subgroup as a protocol: every module restricts itself (escnn's ``Representation.restrict``).

A *restriction* (:class:`Restriction`) holds the group G of a model, the subgroup H and how G's feature
types become H's (for irrep features an H-equivariant isometry, for regular features a permutation of
the frames and the cosets). :func:`restrictor` registers ``fn(module, restriction) -> module`` for a
module type and a kind of restriction; :func:`restrict_module` looks it up along both MROs, copies
group-agnostic modules as they are, and raises a ValueError naming the type otherwise. Every restricted
module is built through its public constructor from the restricted feature types, its parameters loaded;
containers (module lists, blocks, the model: :func:`restricted_model`) from their restricted children.

A restricted module computes the same function on the restricted features, is H-equivariant as a
module of H in its own right (its layers are H's layers), and has at least as many free parameters.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.models.vit import EquivariantViT
from eqvit.nn.irrep_blocks import ClassTokenHead
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Block, DropPath, InputCheck
from eqvit.nn.posenc.base import NoPositionalEncoding
from eqvit.nn.posenc.latitude import LatitudeEncoding
from eqvit.nn.tokenizers.hexagonal import SquareToHex
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed, IcosphereUnpatchify
from eqvit.nn.tokenizers.platonic import CentredPoints


class Restriction:
    """G, H and the map of G's feature types to H's (subclasses: irrep features, regular features).

    Attributes:
        G: the group of the model being restricted.
        H: the subgroup (``H.parent is G``).
        memo: restricted modules by the id of their original (a module registered twice stays one).
    """

    def __init__(self, G: FiniteGroup, H: FiniteGroup) -> None:
        if H.parent is not G:
            raise ValueError(f"{H!r} is not a subgroup taken from {G!r} (use find_subgroup)")
        self.G, self.H = G, H
        self.memo: dict[int, tuple[nn.Module, nn.Module]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.G.name} -> {self.H.name})"

    def restricted_type(self, ftype: FeatureType) -> FeatureType:
        """The H feature type of the G feature type ``ftype``."""
        raise NotImplementedError


Restrictor = Callable[[nn.Module, Restriction], nn.Module]
RESTRICTORS: dict[tuple[type, type], Restrictor] = {}

# Modules that do not see the group (pointwise maps, dropout, invariant data): copied as they are.
GROUP_AGNOSTIC: tuple[type, ...] = (
    nn.Identity,
    nn.Dropout,
    nn.GELU,
    DropPath,
    InputCheck,
    ClassTokenHead,
    SquareToHex,  # a fixed resampling that commutes with the model's symmetries
    NoPositionalEncoding,
    LatitudeEncoding,
    IcospherePatchEmbed,
    IcosphereUnpatchify,
    CentredPoints,
)


def restrictor(*types: type, kind: type = Restriction) -> Callable[[Restrictor], Restrictor]:
    """Register ``fn(module, restriction) -> module`` for modules of ``types`` under restrictions of ``kind``."""

    def register(fn: Restrictor) -> Restrictor:
        for t in types:
            RESTRICTORS[t, kind] = fn
        return fn

    return register


def find_restrictor(module: nn.Module, restriction: Restriction) -> Restrictor | None:
    """The most specific registered restrictor (module type first, then the kind of restriction)."""
    for t in type(module).__mro__:
        for kind in type(restriction).__mro__:
            fn = RESTRICTORS.get((t, kind))
            if fn is not None:
                return fn
    return None


def restrict_module(module: nn.Module, restriction: Restriction) -> nn.Module:
    """``module`` restricted to ``restriction.H``: its registered restrictor, a copy for group-agnostic
    modules, a ValueError naming the type otherwise."""
    hit = restriction.memo.get(id(module))
    if hit is not None:  # a module registered twice (the model's posenc and rope) stays one module
        return hit[1]
    fn = find_restrictor(module, restriction)
    if fn is not None:
        new = fn(module, restriction)
    elif isinstance(module, GROUP_AGNOSTIC):
        new = copy.deepcopy(module)
    else:
        raise ValueError(
            f"no restriction to a subgroup is known for {type(module).__name__} under "
            f"{type(restriction).__name__}; register one with eqvit.models.restriction.restrictor"
        )
    restriction.memo[id(module)] = (module, new)
    return new


@restrictor(nn.ModuleList)
def _restrict_module_list(modules: nn.ModuleList, restriction: Restriction) -> nn.ModuleList:
    return nn.ModuleList(restrict_module(m, restriction) for m in modules)


@restrictor(nn.Sequential)
def _restrict_sequential(modules: nn.Sequential, restriction: Restriction) -> nn.Sequential:
    return nn.Sequential(OrderedDict((n, restrict_module(m, restriction)) for n, m in modules.named_children()))


@restrictor(nn.ModuleDict)
def _restrict_module_dict(modules: nn.ModuleDict, restriction: Restriction) -> nn.ModuleDict:
    return nn.ModuleDict({n: restrict_module(m, restriction) for n, m in modules.items()})


@restrictor(Block)
def _restrict_block(block: Block, restriction: Restriction) -> Block:
    """The block of the restricted layers (the same drop-path rate)."""

    def r(module: nn.Module) -> nn.Module:
        return restrict_module(module, restriction)

    return Block(
        r(block.norm1),
        r(block.attn),
        r(block.norm2),
        r(block.mlp),
        ls1=r(block.ls1),
        ls2=r(block.ls2),
        drop_path=block.drop_path_rate,
    )


def restricted_model(
    model: EquivariantViT, restriction: Restriction, group: FiniteGroup, token_type: FeatureType, /, **config: Any
) -> EquivariantViT:
    """``model``'s class built through its constructor from ``model``'s restricted components, with the
    restricted model's ``group`` and ``token_type``; its config records ``config`` too, and it keeps the
    model's timm configuration, gradient checkpointing and train / eval mode."""

    def r(module: nn.Module) -> nn.Module:
        return restrict_module(module, restriction)

    new = type(model)(
        tokenizer=r(model.tokenizer),
        blocks=r(model.blocks),
        norm=r(model.norm),
        head=r(model.head),
        embed_dim=model.embed_dim,
        posenc=r(model.posenc),
        readout=r(model.readout),
        input_encoding=r(model.input_encoding),
        domain=model.domain,
        group=group,
        token_type=token_type,
        token_grid=model.token_grid,
        to_token_type=r(model.to_token_type),
        in_chans=model.in_chans,
        out_chans=model.out_chans,
        residual=model.residual,
        drop_rate=model.pos_drop.p,
        config=dict(model.config, **config),
    )
    like = next(model.parameters())
    # Constructors build their buffers in the default dtype; the exact ones re-derive from float64 masters here.
    new = new.to(device=like.device, dtype=like.dtype)
    new.default_cfg = new.pretrained_cfg = dict(getattr(model, "default_cfg", {}))
    new.set_grad_checkpointing(model.grad_checkpointing)
    return new.train(model.training)


def as_parameter(values: np.ndarray | torch.Tensor, like: torch.Tensor) -> nn.Parameter:
    """A parameter with ``values`` in ``like``'s dtype and device."""
    return nn.Parameter(torch.as_tensor(values).to(dtype=like.dtype, device=like.device).contiguous())


def count_parameters(model: nn.Module) -> int:
    """Free parameters (numbers) of ``model``."""
    return sum(p.numel() for p in model.parameters())
