"""Hexagonal patches for D6 and its subgroups (O(2) seed, Fig. 2, App. F) on :class:`HexPatchGrid`."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from eqvit.geometry.hexagonal import HexPatchGrid
from eqvit.groups import FiniteGroup
from eqvit.nn.buffers import ExactBuffers
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


class SquareToHex(ExactBuffers):
    """``[B, C, H, W] -> [B, C, P]``: bilinear samples of a square image at the hexagonal ``points``
    (App. F: "bilinear interpolation to convert a square image to one defined on H0").

    The hexagonal domain (centred at the origin) is scaled so that its outermost point lands on the
    inscribed circle of the image's pixel centres; x to the right, y up (as :func:`~eqvit.geometry.square_grid`).
    It commutes with the symmetries the square grid and the hexagonal points share (for D6: the half turn
    and the two axis reflections). The hexagonal models take it as their first layer (a leaf for
    ``torch.fx``: its size check is Python control flow).

    Args:
        img_size: ``H`` (= ``W``) or ``(H, W)`` of the square input.
        points: ``[P, 2]`` hexagonal points, e.g. ``HexPatchGrid(9, 9).points``.
    """

    def __init__(self, img_size: int | tuple[int, int], points: np.ndarray) -> None:
        super().__init__()
        H, W = (img_size, img_size) if isinstance(img_size, int) else img_size
        self.img_size = (int(H), int(W))
        points = np.asarray(points, dtype=np.float64)
        radius = np.linalg.norm(points, axis=1).max()
        self.scale = (min(H, W) - 1) / 2 / max(radius, 1e-12)  # pixels per hexagonal unit
        # align_corners=True: -1 and +1 are the centres of the first and last pixel.
        gx = points[:, 0] * self.scale * 2 / max(W - 1, 1)
        gy = -points[:, 1] * self.scale * 2 / max(H - 1, 1)
        grid = torch.from_numpy(np.stack([gx, gy], -1)[None, None])  # [1, 1, P, 2]
        self.register_exact_buffer("grid", grid)
        self.num_points = len(points)

    def extra_repr(self) -> str:
        return f"img_size={self.img_size}, points={self.num_points}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, C, H, W] -> [B, C, P]``."""
        if x.ndim != 4 or tuple(x.shape[-2:]) != self.img_size:
            H, W = self.img_size
            raise ValueError(f"expected images [B, C, {H}, {W}], got shape {list(x.shape)}")
        grid = self.grid.expand(x.shape[0], -1, -1, -1)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)[:, :, 0]
