"""Homogeneous-space (Fourier) nonlinearity (O(2) seed, Sec. 4.3, eq. 9-11).

For a G-set ``X = (+)_alpha n_alpha G/H_alpha`` the functions ``C(X, R)`` decompose into irreps
(eq. 9, the "Fourier transform" FT). The nonlinearity ``V' -> V'`` is ``FT o sigma o FT^-1``
(eq. 10): inverse FT to values on X, the pointwise ``sigma`` (GELU), FT back. Permutations commute
with pointwise maps, so it is equivariant; ``V'`` is fixed by X (``C'_rho = sum_alpha Gamma_rho^alpha n_alpha``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType

SpaceSpec = tuple[Sequence[int] | np.ndarray | str, int]
"""``(H, n)``: n copies of G/H; H as sorted element indices, ``"regular"`` ({e}) or ``"trivial"`` (G)."""


def _subgroup_indices(group: FiniteGroup, spec) -> np.ndarray:
    if isinstance(spec, str):
        if spec == "regular":
            return np.array([0])
        if spec == "trivial":
            return np.arange(group.order)
        raise ValueError(f"unknown homogeneous space {spec!r}; valid: 'regular', 'trivial' or subgroup indices")
    return np.asarray(spec, dtype=np.int64)


def homogeneous_fourier_basis(
    group: FiniteGroup, spaces: Sequence[SpaceSpec], layout: str = "copies"
) -> tuple[FeatureType, np.ndarray, np.ndarray]:
    """The feature type of ``C(X, R)`` and its inverse Fourier transform.

    With ``layout="copies"`` the copies of an irrep are numbered orbit by orbit; with
    ``"components"`` slot-major (the k-th copy of rho in orbit p is copy ``k * P_rho + p``), so that for
    ``n`` copies of one space the coefficients of orbit p sit at ``start + s * n + p`` (s the orbit's
    coefficient index): the transform is one ``[|G/H|, |G/H|] @ [..., |G/H|, n]`` matmul, no gather.

    Returns:
        ``(ftype, basis, permutations)``: ``basis [|X|, ftype.dim]`` orthogonal with
        ``f = basis @ h`` the function on X with irrep coefficients ``h`` (eq. 9 inverted), and
        ``permutations [order, |X|]`` the action on X (``P(g) basis = basis rho_V'(g)``).
    """
    pieces = []  # (space offset, Q, irreps of Q's columns)
    perms = []
    offset = 0
    for spec, count in spaces:
        if count < 0:
            raise ValueError(f"homogeneous space counts must be non-negative, got {count}")
        hs = group.homogeneous_space(_subgroup_indices(group, spec))
        for _ in range(int(count)):
            pieces.append((offset, hs.fourier_basis, hs.representation.irreps))
            perms.append(hs.permutations + offset)
            offset += hs.size
    if not pieces:
        raise ValueError("expected at least one homogeneous space")
    names = [rho.name for rho in group.irreps]
    counts = [0] * len(names)
    for _, _, irreps in pieces:
        for rho in irreps:
            counts[names.index(rho.name)] += 1
    ftype = FeatureType(group, counts, layout=layout)
    # (slot k of irrep i in piece p) -> copy index: orbit by orbit, or slot-major for "components".
    slots = [[] for _ in names]
    for p, (_, _, irreps) in enumerate(pieces):
        seen = [0] * len(names)
        for rho in irreps:
            i = names.index(rho.name)
            slots[i].append((seen[i], p) if layout == "components" else (p, seen[i]))
            seen[i] += 1
    rank = [{key: n for n, key in enumerate(sorted(keys))} for keys in slots]
    basis = np.zeros((offset, ftype.dim))
    for p, (start, Q, irreps) in enumerate(pieces):
        col, seen = 0, [0] * len(names)
        for rho in irreps:
            i = names.index(rho.name)
            key = (seen[i], p) if layout == "components" else (p, seen[i])
            basis[start : start + len(Q), ftype.block_coords(i)[rank[i][key]]] = Q[:, col : col + rho.dim]
            seen[i] += 1
            col += rho.dim
    return ftype, basis, np.concatenate(perms, axis=1)


class FourierActivation(ExactBuffers):
    """``h -> FT(sigma(FT^-1 h))`` on ``[..., ftype.dim]`` (eq. 10).

    Args:
        ftype: the feature type ``V'`` (must be the one of ``C(X, R)``).
        basis: ``[|X|, ftype.dim]`` inverse Fourier transform (:func:`homogeneous_fourier_basis`).
        act: the pointwise nonlinearity (default GELU).
    """

    def __init__(self, ftype: FeatureType, basis: np.ndarray, act: nn.Module | None = None) -> None:
        super().__init__()
        basis = np.asarray(basis, dtype=np.float64)
        if basis.shape[1] != ftype.dim:
            raise ValueError(f"expected a basis with {ftype.dim} columns for {ftype}, got {list(basis.shape)}")
        self.in_type = self.out_type = ftype
        self.register_exact_buffer("basis", torch.from_numpy(basis))
        self.act = act if act is not None else nn.GELU()
        # The basis is block-diagonal up to permutations (one block per orbit of X): find the
        # blocks and apply them batched, |X_s| multiply-adds per coordinate instead of dim.
        self._sizes = []  # (orbits, orbit size) per group of equal-size blocks
        self._shared = []
        order = []
        for n, (rows, cols) in enumerate(_blocks_by_size(basis)):
            self._sizes.append(rows.shape)
            order.append(cols.reshape(-1))
            self.register_buffer(f"cols_{n}", torch.from_numpy(cols), persistent=False)
            blocks = basis[rows[:, :, None], cols[:, None, :]]  # [n, |X_s|, |X_s|]
            self.register_exact_buffer(f"blocks_{n}", torch.from_numpy(np.ascontiguousarray(blocks)))
            # Copies of one homogeneous space share their block: then one [s, s] matmul suffices.
            self._shared.append(bool(np.array_equal(blocks, np.broadcast_to(blocks[:1], blocks.shape))))
        # Coordinates orbit by orbit: an MLP folds this into its linear maps (no gathers).
        self.register_buffer("perm", torch.from_numpy(np.concatenate(order)), persistent=False)
        # Strided: one shared block whose orbit n holds coordinates ``slab_j * n_orbits + n`` (the
        # "components" layout of copies of one space): the transform is a matmul on ``[..., s, n]``.
        strided = _strided_slabs(basis, self._sizes, self._shared, order)
        self.strided = strided is not None
        self._impl = _strided_forward if self.strided else _gather_forward
        if self.strided:
            block = self.exact_buffer("blocks_0").numpy()[0]  # values = block @ coefficients
            inverse = np.zeros_like(block)
            inverse[:, strided] = block  # columns by slab
            self.register_exact_buffer("slab_inverse", torch.from_numpy(inverse))  # [s(x), s(slab)]
            self.register_exact_buffer("slab_forward", torch.from_numpy(np.ascontiguousarray(inverse.T)))

    @classmethod
    def from_spaces(
        cls, group: FiniteGroup, spaces: Sequence[SpaceSpec], act: nn.Module | None = None
    ) -> FourierActivation:
        ftype, basis, _ = homogeneous_fourier_basis(group, spaces)
        return cls(ftype, basis, act)

    def extra_repr(self) -> str:
        return f"{self.in_type}, |X|={self.basis.shape[0]}"

    def forward_permuted(self, x: torch.Tensor) -> torch.Tensor:
        """The nonlinearity on ``x[..., perm]`` (coordinates orbit by orbit); returns the same order."""
        outs, start = [], 0
        for n, (count, size) in enumerate(self._sizes):
            blocks = getattr(self, f"blocks_{n}")
            xn = x[..., start : start + count * size].unflatten(-1, (count, size))
            if self._shared[n]:
                block = blocks[0]
                outs.append((self.act(xn @ block.T) @ block).flatten(-2))
            else:
                values = self.act(torch.einsum("...ni,nxi->...nx", xn, blocks))
                outs.append(torch.einsum("...nx,nxi->...ni", values, blocks).flatten(-2))
            start += count * size
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]

    def fold_into_linears(
        self, w_in: torch.Tensor, b_in: torch.Tensor | None, w_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Fold the Fourier transforms into the adjacent linear maps (an MLP's fc1 and fc2).

        ``w_in [ftype.dim, d_in]``, ``b_in [ftype.dim]`` map into the irrep coefficients and
        ``w_out [d_out, ftype.dim]`` maps out of them. Returns ``(w_in', b_in', w_out')`` with
        ``w_in' [|X|, d_in]`` producing the values on X (``FT^-1 w_in``) and ``w_out' [d_out, |X|]``
        reading them (``w_out FT``), so that for every input
        ``w_out' sigma(w_in' x + b_in') == w_out FT(sigma(FT^-1 (w_in x + b_in)))``: the MLP becomes
        a plain dense MLP of hidden width |X| with a pointwise ``sigma``. The basis blocks are applied
        orbit by orbit (batched per orbit size), never the dense basis.
        """
        perm = self.perm
        w_in, w_out = w_in[perm], w_out[:, perm]
        b_in = None if b_in is None else b_in[perm]
        ins, bs, outs, start = [], [], [], 0
        for n, (count, size) in enumerate(self._sizes):
            blocks = getattr(self, f"blocks_{n}")  # [count, |X_s|, size]: values = blocks @ coefficients
            stop = start + count * size
            wi = w_in[start:stop].unflatten(0, (count, size))  # [count, size, d_in]
            wo = w_out[:, start:stop].unflatten(1, (count, size))  # [d_out, count, size]
            if self._shared[n]:
                block = blocks[0]
                ins.append((block @ wi).flatten(0, 1))
                outs.append((wo @ block.T).flatten(1))
                if b_in is not None:
                    bs.append((b_in[start:stop].unflatten(0, (count, size)) @ block.T).flatten())
            else:
                ins.append((blocks @ wi).flatten(0, 1))
                outs.append(torch.einsum("dni,nxi->dnx", wo, blocks).flatten(1))
                if b_in is not None:
                    bs.append(
                        torch.einsum("ni,nxi->nx", b_in[start:stop].unflatten(0, (count, size)), blocks).flatten()
                    )
            start = stop

        def cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
            return torch.cat(parts, dim=dim) if len(parts) > 1 else parts[0]

        return cat(ins, 0), None if b_in is None else cat(bs, 0), cat(outs, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., dim] -> FT(sigma(FT^-1 x))``: small per-orbit transforms (a matmul on
        ``[..., |X_s|, n]`` when :attr:`strided`, else gathered per orbit size)."""
        return self._impl(self, x)

    def forward_dense(self, x: torch.Tensor) -> torch.Tensor:
        """Reference: ``FT(sigma(FT^-1 x))`` with the dense basis."""
        return self.act(x @ self.basis.T) @ self.basis


def _gather_forward(m: FourierActivation, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for n in range(len(m._sizes)):
        cols, blocks = getattr(m, f"cols_{n}"), getattr(m, f"blocks_{n}")
        values = m.act(torch.einsum("...ni,nxi->...nx", x[..., cols], blocks))  # sigma on X
        out[..., cols] = torch.einsum("...nx,nxi->...ni", values, blocks)
    return out


def _strided_forward(m: FourierActivation, x: torch.Tensor) -> torch.Tensor:
    slabs = x.unflatten(-1, (m.slab_inverse.shape[1], -1))  # [..., s, n]: no copy
    values = m.act(torch.matmul(m.slab_inverse, slabs))  # sigma on X, [..., |X_s|, n]
    return torch.matmul(m.slab_forward, values).flatten(-2)


def _strided_slabs(basis: np.ndarray, sizes: list, shared: list, order: list) -> np.ndarray | None:
    """``slab [s]`` (coefficient j of every orbit n at ``slab[j] * n_orbits + n``) when the basis has one
    shared block laid out that way, else None."""
    if len(sizes) != 1 or not shared[0]:
        return None
    count, size = sizes[0]
    cols = order[0].reshape(count, size)
    slab, rest = np.divmod(cols[0], count)
    consecutive = np.array_equal(cols, cols[:1] + np.arange(count)[:, None])
    if np.any(rest) or sorted(slab) != list(range(size)) or not consecutive:
        return None
    return slab


def _blocks_by_size(basis: np.ndarray, atol: float = 1e-12) -> list[tuple[np.ndarray, np.ndarray]]:
    """Connected components of the basis' sparsity pattern, grouped by size.

    Returns ``[(rows [n, s], cols [n, s])]``: the component's points of X and coordinates; every
    component is square (an orbit and the irrep copies of its Fourier transform).
    """
    nz = np.abs(basis) > atol
    P, D = basis.shape
    parent = list(range(P + D))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for r, c in zip(*np.nonzero(nz)):
        ra, rb = find(int(r)), find(P + int(c))
        if ra != rb:
            parent[ra] = rb
    comps: dict[int, tuple[list[int], list[int]]] = {}
    for r in range(P):
        comps.setdefault(find(r), ([], []))[0].append(r)
    for c in range(D):
        comps.setdefault(find(P + c), ([], []))[1].append(c)
    by_size: dict[int, list[tuple[list[int], list[int]]]] = {}
    for rows, cols in comps.values():
        if len(rows) != len(cols):
            raise ValueError("Fourier basis blocks must be square (one orbit and its irrep copies)")
        by_size.setdefault(len(rows), []).append((rows, cols))
    return [
        (np.array([r for r, _ in comps_s], dtype=np.int64), np.array([c for _, c in comps_s], dtype=np.int64))
        for _, comps_s in sorted(by_size.items())
    ]
