"""``eqvit.restrict``: a G-model as an H-model computing the same function (O(2) seed, Theorem 2).

Restriction is a protocol (:mod:`eqvit.models.restriction`): every module restricts itself given the
restricted feature types. Irrep-feature models (``o2vit_*``) restrict through the isometries of
:mod:`eqvit.models.restrict_irreps` (each G irrep copy becomes H irrep copies), Platonic Transformers
(``platonic_*``) through the frame and coset permutation of :mod:`eqvit.models.restrict_platonic` (the
regular representation of G restricted to H is ``|G:H|`` copies of H's). Every positional scheme and
attention layout a model can be built with restricts.
"""

from __future__ import annotations

import numpy as np

from eqvit.groups import FiniteGroup
from eqvit.models.restrict_irreps import is_irrep_model, restrict_irrep_model, restriction_map
from eqvit.models.vit import EquivariantViT
from eqvit.utils import unknown_name_error

__all__ = ["SymmetryRelaxation", "find_subgroup", "restrict", "restriction_map"]


def find_subgroup(group: FiniteGroup, subgroup: str | FiniteGroup | np.ndarray) -> FiniteGroup:
    """The subgroup of ``group`` called ``subgroup`` (e.g. ``"C4"``, ``"D2"``, ``"D3[30deg]"``)."""
    if isinstance(subgroup, FiniteGroup):
        if subgroup.parent is not group:
            raise ValueError(f"{subgroup!r} was not taken from {group!r} (use group.subgroup(...))")
        return subgroup
    if not isinstance(subgroup, str):
        return group.subgroup(np.asarray(subgroup, dtype=np.int64))
    if group.dim == 3:  # the Platonic frames: subgroups named by structure ("T", "D2", "C3", ...)
        from eqvit.models.restrict_platonic import find_spatial_subgroup

        return find_spatial_subgroup(group, subgroup)
    names = {}
    for idx in group.all_subgroups():
        names.setdefault(group.subgroup(idx).name, idx)
    if subgroup == group.name:
        return group.subgroup(np.arange(group.order))
    if subgroup not in names:
        raise unknown_name_error(f"subgroup of {group.name}", subgroup, list(names))
    return group.subgroup(names[subgroup])


def restrict(model: EquivariantViT, subgroup: str | FiniteGroup) -> EquivariantViT:
    """An H-equivariant model computing the same function as the G-equivariant ``model`` (Theorem 2).

    Args:
        model: an O(2)-subgroup ViT (``eqvit.create_model("o2vit_*")``), a Platonic Transformer
            (``platonic_*``, restricted frame by frame) or a restricted one, with any positional scheme
            and attention layout.
        subgroup: a subgroup name of the group of the model's features (``model.token_type.group``: ``"C4"``,
            ``"D2"``, ``"D1"``, ...; for Platonic models of ``model.frames``, e.g. ``"T"``), or a FiniteGroup
            taken from it with ``.subgroup(indices)``.

    Returns:
        A new model (same dtype, device, eval/train mode) with ``.group`` the subgroup (for a hexagonal model
        on square images, its elements that map the image onto itself) and at least as many free parameters.
    """
    from eqvit.models.restrict_platonic import is_platonic, restrict_platonic

    if is_platonic(model):
        return restrict_platonic(model, subgroup)
    if not is_irrep_model(model):
        raise ValueError(
            "restrict() expects an O(2)-subgroup ViT (o2vit_*) or a Platonic Transformer (platonic_*), "
            f"got {type(model).__name__}"
        )
    return restrict_irrep_model(model, find_subgroup(model.token_type.group, subgroup))


class SymmetryRelaxation:
    """Gradual symmetry breaking (the seed's remark after Theorem 2): G-equivariant early, a subgroup later.

    For O(2)-subgroup ViTs and Platonic Transformers alike (both through :func:`restrict`).

    Args:
        schedule: ``{epoch: subgroup name}``; at the start of that epoch the model is replaced by its
            :func:`restrict`-ion (same function, more freedom), e.g. ``{10: "D2", 20: "C1"}``.

    ``model, changed = relaxation.step(model, epoch)``; when ``changed`` the caller rebuilds its
    optimizer (the parameters are new tensors; optimizer state restarts).
    """

    def __init__(self, schedule: dict[int, str]) -> None:
        if any(int(e) < 0 for e in schedule):
            raise ValueError(f"relaxation epochs must be non-negative, got {sorted(schedule)}")
        self.schedule = {int(e): s for e, s in sorted(schedule.items())}

    def step(self, model: EquivariantViT, epoch: int) -> tuple[EquivariantViT, bool]:
        target = self.schedule.get(int(epoch))
        if target is None or target == model.token_type.group.name:  # the features' group (Platonic: the frames)
            return model, False
        return restrict(model, target), True
