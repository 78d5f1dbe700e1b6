"""Learned absolute position embedding (breaks every symmetry; the non-equivariant ablation)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from eqvit.nn.posenc.base import PositionalScheme


class LearnedAPE(PositionalScheme):
    """A learned vector per token position, added after tokenization: ``x + p``, ``p [1, N, C]``."""

    keeps_symmetry = False  # one free vector per token

    def __init__(self, num_tokens: int, dim: int, std: float = 0.02) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(torch.randn(1, num_tokens, dim) * std)

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        # torch._assert: the model makes the tokens (its input check covers user input); traceable by torch.fx
        torch._assert(x.shape[1] == self.pos_embed.shape[1], f"expected {self.pos_embed.shape[1]} tokens")
        return x + self.pos_embed


def pose_orbits(poses: np.ndarray, elements: np.ndarray, atol: float = 1e-9) -> np.ndarray:
    """int64 ``[N]``: the orbit of each pose ``poses [N, 3, 3]`` under left multiplication by ``elements``.

    Every ``g R_n`` must be one of the poses (the token poses are closed under the group); a
    ValueError otherwise.
    """
    poses = np.asarray(poses, dtype=np.float64)
    flat = poses.reshape(len(poses), -1)
    parent = np.arange(len(poses))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for g in np.asarray(elements, dtype=np.float64):
        moved = np.einsum("ij,njk->nik", g, poses).reshape(len(poses), -1)
        dist = np.abs(moved[:, None] - flat[None]).max(-1)
        target = dist.argmin(1)
        if not (dist[np.arange(len(poses)), target] < atol).all():
            raise ValueError("the token poses are not closed under the group: no invariant APE on them")
        for n, m in enumerate(target):
            a, b = find(n), find(int(m))
            if a != b:
                parent[max(a, b)] = min(a, b)
    roots = np.array([find(i) for i in range(len(poses))])
    _, orbit = np.unique(roots, return_inverse=True)
    return orbit.astype(np.int64)


class OrbitAPE(PositionalScheme):
    """A learned APE that is exactly invariant: one learned vector per orbit of the token poses.

    The group moves token n to the token at pose ``g R_n``; an embedding constant on the orbits is
    unchanged by that permutation, so the tokens stay invariant features (the analogue of the O(2)
    invariant APE for the scalar tokens of SO3ViT: ``p[n] = e[orbit(n)]``).

    Args:
        poses: ``[N, 3, 3]`` token poses.
        elements: ``[|G|, 3, 3]`` the group (the icosahedral rotations for SO3ViT).
        dim: token width.
    """

    def __init__(self, poses: np.ndarray, elements: np.ndarray, dim: int, std: float = 0.02) -> None:
        super().__init__()
        orbit = pose_orbits(poses, elements)
        self.num_tokens, self.num_orbits = len(orbit), int(orbit.max()) + 1
        self.register_buffer("orbit", torch.from_numpy(orbit), persistent=False)
        self.pos_embed = nn.Parameter(torch.randn(self.num_orbits, dim) * std)

    def extra_repr(self) -> str:
        return f"{self.num_tokens} tokens in {self.num_orbits} orbits"

    def embedding(self) -> torch.Tensor:
        """``[N, dim]`` the encoding."""
        return self.pos_embed[self.orbit]

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        # torch._assert: the model makes the tokens (its input check covers user input); traceable by torch.fx
        torch._assert(x.shape[1] == self.num_tokens, f"expected {self.num_tokens} tokens")
        return x + self.embedding()

    def fold(self) -> nn.Module:
        """The inference form: the encoding fixed."""
        from eqvit.nn.folded import FoldedAPE

        return FoldedAPE(self.embedding())
