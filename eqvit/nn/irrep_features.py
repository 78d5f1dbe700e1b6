"""Feature types: the currency of every equivariant layer (e3nn's ``Irreps``, escnn's ``FieldType``).

A :class:`FeatureType` names the group, the multiplicity of each irrep, and the basis its tensors
live in:

* ``basis="irrep"`` (O(2) seed, eq. 2): ``V = (+)_rho R^{C_rho} (x) V_rho`` stored irrep-wise. A
  token feature is one flat vector of length ``dim = sum_rho C_rho d_rho``: the irreps in the
  group's order, each irrep one contiguous block. Inside the rho block the ``layout`` decides:

  - ``"copies"``: the ``C_rho`` copies one after another, each holding its ``d_rho`` components
    (a row-major ``[C_rho, d_rho]`` array); g acts by ``blockdiag_rho(I_{C_rho} (x) rho(g))``.
  - ``"components"``: component-major, a row-major ``[d_rho, C_rho]`` array (component a of every
    copy side by side); g acts by ``blockdiag_rho(rho(g) (x) I_{C_rho})``. A Schur linear
    ``w (x) I`` is then ``I (x) w``: one ``[C'', C']`` matmul per component on contiguous column
    slabs, the Schur minimum of multiply-adds (:class:`~eqvit.nn.linear.IrrepLinear`), with no
    gather or copy per layer; this is the layout the ViT-scale models use.
* ``basis="frames"`` (Platonic seed, Sec. 3): ``C`` copies of the regular representation stored as
  functions on the frames, ``[..., |G| * C]`` frame-major (entry ``j * C + c`` is channel c seen
  from frame ``R_j``). g acts by ``(L_g f)(R_j) = f(R_{cayley[g^-1, j]})``, a permutation of frames.

The two bases of the regular representation are related by the orthogonal group Fourier transform
(:attr:`FeatureType.fourier`): ``x_frames @ fourier`` are the same features in the irrep basis of
:meth:`FeatureType.in_irrep_basis`. Layers that act per frame (frame RoPE, frames-as-heads, the
pointwise GELU) read the frame basis; irrep-wise (Schur) linears, coupled and irrep-wise heads and
the Fourier nonlinearity read the irrep basis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np
import torch

from eqvit.groups import FiniteGroup, Irrep

BASES = ("irrep", "frames")
LAYOUTS = ("copies", "components")


class FeatureType:
    """The G-representation ``(+)_rho R^{C_rho} (x) V_rho``, in the irrep basis or on frames.

    Args:
        group: the finite group G.
        multiplicities: ``{irrep name: C_rho}`` (missing names count 0) or one count per irrep
            in ``group.irreps`` order.
        basis: ``"irrep"`` (irrep-wise storage) or ``"frames"`` (functions on G; only for multiples
            of the regular representation, use :meth:`frames`).
        layout: order inside each irrep block of the irrep basis, ``"copies"`` (``[C_rho, d_rho]``)
            or ``"components"`` (``[d_rho, C_rho]``); a frame-basis type keeps it for its irrep twin.
    """

    def __init__(
        self,
        group: FiniteGroup,
        multiplicities: Mapping[str, int] | Sequence[int],
        basis: str = "irrep",
        layout: str = "copies",
    ) -> None:
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r}; valid: {', '.join(BASES)}")
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; valid: {', '.join(LAYOUTS)}")
        self.layout = layout
        names = [rho.name for rho in group.irreps]
        if isinstance(multiplicities, Mapping):
            unknown = [k for k in multiplicities if k not in names]
            if unknown:
                raise ValueError(f"unknown irreps {unknown} of {group.name}; valid: {', '.join(names)}")
            counts = [int(multiplicities.get(n, 0)) for n in names]
        else:
            counts = [int(c) for c in multiplicities]
            if len(counts) != len(names):
                raise ValueError(f"expected {len(names)} multiplicities for {group.name} ({names}), got {len(counts)}")
        if any(c < 0 for c in counts):
            raise ValueError(f"multiplicities must be non-negative, got {counts}")
        self.group = group
        self.irreps: list[Irrep] = list(group.irreps)
        self.multiplicities: list[int] = counts
        offsets = np.cumsum([0] + [c * rho.dim for c, rho in zip(counts, self.irreps)])
        self.offsets = offsets
        self.dim = int(offsets[-1])
        self.basis = basis
        if basis == "frames":
            regular = [rho.dim // rho.type_factor for rho in self.irreps]
            if self.dim % group.order or counts != [r * (self.dim // group.order) for r in regular]:
                raise ValueError(
                    f"the frame basis holds multiples of the regular representation of {group.name} "
                    f"(multiplicities proportional to {regular}), got {counts}"
                )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def regular(cls, group: FiniteGroup, copies: int = 1, layout: str = "copies") -> FeatureType:
        """``copies`` copies of the regular representation: ``C_rho = copies * d_rho / type_factor``."""
        return cls(group, [copies * rho.dim // rho.type_factor for rho in group.irreps], layout=layout)

    @classmethod
    def frames(cls, group: FiniteGroup, channels: int, layout: str = "copies") -> FeatureType:
        """``channels`` copies of the regular representation on the frames: ``[..., |G| * channels]``."""
        return cls(
            group, [channels * rho.dim // rho.type_factor for rho in group.irreps], basis="frames", layout=layout
        )

    @classmethod
    def trivial(cls, group: FiniteGroup, channels: int, layout: str = "copies") -> FeatureType:
        """``channels`` invariant scalars (logits, pooled features)."""
        return cls(group, {group.irreps[0].name: channels}, layout=layout)

    def with_layout(self, layout: str) -> FeatureType:
        """The same representation and basis with another :data:`LAYOUTS` order inside the irrep blocks."""
        return self if layout == self.layout else FeatureType(self.group, self.multiplicities, self.basis, layout)

    @property
    def channels(self) -> int:
        """Channels per frame of a frame-basis type (``dim / |G|``)."""
        if self.basis != "frames":
            raise ValueError(f"channels per frame are defined for the frame basis, {self} is in the irrep basis")
        return self.dim // self.group.order

    def in_irrep_basis(self) -> FeatureType:
        """The same representation stored irrep-wise."""
        return self if self.basis == "irrep" else FeatureType(self.group, self.multiplicities, layout=self.layout)

    def in_frame_basis(self) -> FeatureType:
        """The same representation on the frames (ValueError unless it is a multiple of the regular one)."""
        if self.basis == "frames":
            return self
        return FeatureType(self.group, self.multiplicities, basis="frames", layout=self.layout)

    def __deepcopy__(self, memo: dict) -> FeatureType:
        return self  # immutable, like its group

    def __repr__(self) -> str:
        if self.basis == "frames":
            return f"FeatureType({self.group.name}: {self.channels} x regular on frames; dim={self.dim})"
        parts = ", ".join(f"{rho.name}x{c}" for rho, c in zip(self.irreps, self.multiplicities) if c)
        layout = "" if self.layout == "copies" else ", components"
        return f"FeatureType({self.group.name}: {parts}; dim={self.dim}{layout})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FeatureType)
            and other.group is self.group
            and other.multiplicities == self.multiplicities
            and other.basis == self.basis
            and other.layout == self.layout
        )

    def __hash__(self) -> int:
        return hash((id(self.group), tuple(self.multiplicities), self.basis, self.layout))

    def __mul__(self, n: int) -> FeatureType:
        return FeatureType(self.group, [c * n for c in self.multiplicities], basis=self.basis, layout=self.layout)

    __rmul__ = __mul__

    def __add__(self, other: FeatureType) -> FeatureType:
        if other.group is not self.group:
            raise ValueError(f"cannot add feature types of {self.group.name} and {other.group.name}")
        if self.basis != "irrep" or other.basis != "irrep":
            raise ValueError("direct sums are taken in the irrep basis; convert with in_irrep_basis() first")
        if other.layout != self.layout:
            raise ValueError(f"cannot add feature types of layouts {self.layout!r} and {other.layout!r}")
        return FeatureType(
            self.group, [a + b for a, b in zip(self.multiplicities, other.multiplicities)], layout=self.layout
        )

    # ------------------------------------------------------------------ layout (irrep basis)
    def blocks(self) -> list[tuple[int, Irrep, int, slice]]:
        """``(irrep index, irrep, C_rho, slice of the flat vector)`` for every irrep with C_rho > 0."""
        return [
            (i, rho, c, slice(int(self.offsets[i]), int(self.offsets[i + 1])))
            for i, (rho, c) in enumerate(zip(self.irreps, self.multiplicities))
            if c
        ]

    def block_coords(self, i: int) -> np.ndarray:
        """int64 ``[C_rho, d_rho]``: the coordinate of component a of copy c of irrep ``i`` (index in
        ``group.irreps``), as the :attr:`layout` stores it."""
        rho, c, start = self.irreps[i], self.multiplicities[i], int(self.offsets[i])
        if self.layout == "copies":
            return start + np.arange(c * rho.dim).reshape(c, rho.dim)
        return start + np.arange(c * rho.dim).reshape(rho.dim, c).T

    @cached_property
    def copies(self) -> list[tuple[int, int, np.ndarray]]:
        """``(irrep index, copy index, coordinate indices [d_rho])`` for every irrep copy, by irrep then copy."""
        return [(i, k, coords) for i, _, c, _ in self.blocks() for k, coords in enumerate(self.block_coords(i))]

    @cached_property
    def copy_index(self) -> np.ndarray:
        """int64 ``[dim]``: which copy (position in :attr:`copies`) each coordinate belongs to."""
        out = np.empty(self.dim, dtype=np.int64)
        for n, (_, _, idx) in enumerate(self.copies):
            out[idx] = n
        return out

    @cached_property
    def trivial_index(self) -> np.ndarray:
        """int64 coordinates of the trivial-irrep copies."""
        idx = [coords for i, _, coords in self.copies if self.irreps[i].is_trivial]
        return np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x [..., dim]`` -> one ``[..., C_rho, d_rho]`` tensor per irrep with C_rho > 0 (views)."""
        if self.layout == "copies":
            return [x[..., sl].unflatten(-1, (c, rho.dim)) for _, rho, c, sl in self.blocks()]
        return [x[..., sl].unflatten(-1, (rho.dim, c)).transpose(-1, -2) for _, rho, c, sl in self.blocks()]

    def flatten_copies(self, block: torch.Tensor) -> torch.Tensor:
        """One irrep block ``[..., C_rho, d_rho]`` -> its ``[..., C_rho d_rho]`` coordinates in storage order."""
        return (block.transpose(-1, -2) if self.layout == "components" else block).flatten(-2)

    def join(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Inverse of :meth:`split`: ``[..., C_rho, d_rho]`` per irrep -> ``[..., dim]``."""
        return torch.cat([self.flatten_copies(p) for p in parts], dim=-1)

    # ------------------------------------------------------------------ the representation
    @cached_property
    def representation(self) -> np.ndarray:
        """float64 ``[order, dim, dim]`` in this type's basis: ``blockdiag_rho(I_{C_rho} (x) rho(g))``
        (irrep basis) or the frame permutation ``P(g) (x) I_C`` (frame basis)."""
        G = self.group
        if self.basis == "frames":
            out = np.zeros((G.order, G.order, G.order))
            j = np.arange(G.order)
            for g in range(G.order):
                out[g, j, G.cayley[G.inverse[g], j]] = 1.0  # (L_g f)(R_j) = f(R_{g^-1 j})
            out = np.einsum("gab,cd->gacbd", out, np.eye(self.channels)).reshape(G.order, self.dim, self.dim)
        else:
            out = np.zeros((G.order, self.dim, self.dim))
            for i, rho, _c, _ in self.blocks():
                idx = self.block_coords(i)  # [C, d]: copy k's components
                out[:, idx[:, :, None], idx[:, None, :]] = rho.matrices[:, None]
        out.setflags(write=False)
        return out

    def act(self, g: int, x: torch.Tensor) -> torch.Tensor:
        """Group element ``g`` (an index) applied to features ``x [..., dim]``."""
        if self.basis == "frames":  # a permutation of the frame axis: a gather, no matmul
            source = torch.as_tensor(np.array(self.group.cayley[self.group.inverse[g]]), device=x.device)
            return x.unflatten(-1, (self.group.order, -1))[..., source, :].flatten(-2)
        return x @ torch.tensor(self.representation[g], dtype=x.dtype, device=x.device).T

    @cached_property
    def fourier(self) -> np.ndarray:
        """float64 ``[dim, dim]`` orthogonal: ``x @ fourier`` is ``x`` in the irrep basis (:meth:`in_irrep_basis`).

        The group Fourier transform of functions on G, channel by channel (the identity for a type
        already in the irrep basis); ``y @ fourier.T`` is the inverse. It intertwines the actions:
        ``act_frames(g, x) @ fourier == act_irrep(g, x @ fourier)``.
        """
        if self.basis == "irrep":
            out = np.eye(self.dim)
        else:
            out = _regular_fourier(self.group, self.channels, self.in_irrep_basis())
        out.setflags(write=False)
        return out

    def to_irrep_basis(self, x: torch.Tensor) -> torch.Tensor:
        """Features ``[..., dim]`` in this basis -> the same features in the irrep basis."""
        return x @ torch.tensor(self.fourier, dtype=x.dtype, device=x.device)

    def from_irrep_basis(self, y: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`to_irrep_basis`."""
        return y @ torch.tensor(self.fourier.T, dtype=y.dtype, device=y.device)


def _regular_fourier(group: FiniteGroup, channels: int, irrep_type: FeatureType) -> np.ndarray:
    """``[|G| C, dim]``: frame-major functions on G (C channels) -> ``irrep_type``'s irrep-wise storage.

    C(G) = C(G/{e}) is a homogeneous space; its orthogonal Fourier basis ``Q`` (``P(g) Q = Q
    blockdiag(rho(g))``) gives one copy of each irrep per column group. Channel c of copy k of rho
    (rho occurs ``m = d_rho / type_factor`` times in the regular representation) goes to irrep copy
    ``c * m + k`` of ``irrep_type``: channel-major, so that a contiguous range of channels is a
    contiguous range of copies of every irrep. Coupled heads (:func:`~eqvit.nn.irrep_attention.coupled_heads`)
    are then exactly channel groups over all frames (the Platonic seed's invariant scores), and frame
    RoPE on those channels keeps its scores relative.
    """
    space = group.homogeneous_space(np.array([0]))
    Q, names = space.fourier_basis, [rho.name for rho in group.irreps]
    out = np.zeros((group.order, channels, irrep_type.dim))
    seen = [0] * len(names)
    col = 0
    for rho in space.representation.irreps:
        i = names.index(rho.name)
        m = rho.dim // rho.type_factor  # copies of rho in the regular representation
        coords = irrep_type.block_coords(i)
        for c in range(channels):
            out[:, c, coords[c * m + seen[i]]] = Q[:, col : col + rho.dim]
        seen[i] += 1
        col += rho.dim
    return out.reshape(group.order * channels, irrep_type.dim)
