"""Square patches for D4 and its subgroups (O(2) seed, eq. 1): ``U`` = P x P pixels, ``H`` = q x q centres.

Non-overlapping square patches make the unfold + embedding one strided convolution with the
equivariant filters viewed as ``[V.dim, C, P, P]``: no unfolded copy of the image.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from eqvit.geometry.square import square_grid
from eqvit.groups import FiniteGroup
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.tokenizers.planar import PlanarTokenizer

SQUARE_GROUPS = ("D4", "C4", "D2", "C2", "D1", "C1")


def square_patch_layout(img_size: int, patch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets [P^2, 2], centers [q^2, 2], patch_index [q^2, P^2])`` on ``square_grid(img, img)``.

    Pixel (r, c) of patch (i, j) is image pixel ``(i P + r, j P + c)``; its point is
    ``centers[i q + j] + offsets[r P + c]`` (both row-major, x to the right, y up).
    """
    if img_size % patch_size:
        raise ValueError(f"img_size {img_size} must be a multiple of patch_size {patch_size}")
    q, P = img_size // patch_size, patch_size
    i, j, r, c = np.meshgrid(np.arange(q), np.arange(q), np.arange(P), np.arange(P), indexing="ij")
    patch_index = ((i * P + r) * img_size + (j * P + c)).reshape(q * q, P * P)
    return square_grid(P, P), square_grid(q, q) * P, patch_index


class SquarePatchTokenizer(PlanarTokenizer):
    """Square G-patchified grid tokenizer; input ``[B, in_chans, img_size, img_size]``."""

    def __init__(
        self,
        group: FiniteGroup,
        img_size: int,
        patch_size: int,
        in_chans: int,
        out_type: FeatureType,
        class_token: bool = True,
    ) -> None:
        offsets, centers, patch_index = square_patch_layout(img_size, patch_size)
        super().__init__(group, offsets, centers, patch_index, in_chans, out_type, class_token)
        self.img_size, self.patch_size = img_size, patch_size

    def unfold(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, S, S] -> [B, q^2, C P^2]`` by reshapes (the same order as ``patch_index``)."""
        B, C = x.shape[:2]
        q, P = self.img_size // self.patch_size, self.patch_size
        return x.reshape(B, C, q, P, q, P).permute(0, 2, 4, 1, 3, 5).reshape(B, q * q, C * P * P)

    def patch_tokens_with(self, x: torch.Tensor, filters: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``[B, C, S, S] -> [B, q^2, D]``: ``F.conv2d`` with the filters viewed as ``[D, C, P, P]``, stride P.

        The filters are flattened channel-major with pixel ``r P + c`` (:func:`square_patch_layout`),
        so the view is exact and the output equals ``F.linear(unfold(x), filters, bias)``.
        """
        P = self.patch_size
        out = F.conv2d(x, filters.view(filters.shape[0], self.in_chans, P, P), bias, stride=P)  # [B, D, q, q]
        return out.flatten(2).transpose(1, 2)
