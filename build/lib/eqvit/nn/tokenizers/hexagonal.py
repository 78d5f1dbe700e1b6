"""Hexagonal patches for D6 and its subgroups (O(2) seed, Fig. 2, App. F) on :class:`HexPatchGrid`."""

from __future__ import annotations

from eqvit.geometry.hexagonal import HexPatchGrid
from eqvit.groups import FiniteGroup
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.tokenizers.planar import PlanarTokenizer

HEX_GROUPS = ("D6", "C6", "D3", "C3", "D2", "C2", "D1", "C1")


class HexPatchTokenizer(PlanarTokenizer):
    """Hexagonal G-patchified grid tokenizer; input ``[B, in_chans, grid.num_points]``.

    Patches may overlap (shared edges); each patch is read in full.
    """

    def __init__(
        self, group: FiniteGroup, grid: HexPatchGrid, in_chans: int, out_type: FeatureType, class_token: bool = True
    ) -> None:
        super().__init__(
            group, grid.pixel_offsets, grid.patch_centers, grid.patch_index, in_chans, out_type, class_token
        )
        self.grid = grid
