"""Per-token readouts from regular features ``[..., |G| C]`` to a vector and to invariant scalars.

- :class:`FrameVectorReadout`: ``y = (1/|G|) sum_R R W f(R)``, ``W [d, C]``. Frame R holds the feature as seen
  from R; ``W f(R)`` is a vector in R's coordinates and ``R W f(R)`` the same vector in the global frame. Acting
  with g permutes the frames, ``(L_g f)(R) = f(g^-1 R)``, so ``y -> (1/|G|) sum_R R W f(g^-1 R) =
  g (1/|G|) sum_S S W f(S) = g y``: the vector rotates with the input (the inverse of the tokenizer's lifting
  ``f(R) = R^-1 u``).
- :class:`FrameScalarReadout`: ``Linear(mean_R f(R))``, invariant to the frames' permutation.
"""

from __future__ import annotations

import torch
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.init import vit_linear


class FrameVectorReadout(ExactBuffers):
    """Regular features ``[..., |G| C]`` -> vectors ``[..., d]`` in the global frame (module docstring);
    ``W`` is ``zero_init``-ialised for a model whose output starts at zero (DiT's final layer)."""

    def __init__(self, group: FiniteGroup, channels: int, zero_init: bool = False) -> None:
        super().__init__()
        self.order, self.channels, self.dim = group.order, channels, group.dim
        self.register_exact_buffer("frames", torch.from_numpy(group.elements.copy()))  # [G, d, d]
        self.proj = vit_linear(channels, group.dim, bias=False)
        if zero_init:
            nn.init.zeros_(self.proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., |G| C] -> [..., d]``."""
        seen = self.proj(x.unflatten(-1, (self.order, self.channels)))  # [..., G, d] in each frame's coordinates
        return torch.einsum("gij,...gj->...i", self.frames, seen) / self.order


class FrameScalarReadout(nn.Module):
    """Regular features ``[..., |G| C]`` -> invariant scalars ``[..., out]``: the frame mean, then a linear map
    (``zero_init``: weights and bias start at zero)."""

    def __init__(self, group_order: int, channels: int, out_features: int, zero_init: bool = False) -> None:
        super().__init__()
        self.order, self.channels = group_order, channels
        self.proj = vit_linear(channels, out_features)
        if zero_init:
            nn.init.zeros_(self.proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., |G| C] -> [..., out]``."""
        return self.proj(x.unflatten(-1, (self.order, self.channels)).mean(-2))
