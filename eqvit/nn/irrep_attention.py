"""Equivariant multi-head self-attention on irrep-wise features (O(2) seed, Sec. 4.4).

Ordinary multi-head attention with respect to a G-invariant inner product and a G-stable orthogonal
decomposition ``V = V_1 (+) ... (+) V_h`` into heads: the scores ``<P_r q(a), P_r k(b)>`` are
invariant, the values transform like V. With orthogonal irrep matrices the Euclidean inner product
is invariant, and a head is any set of whole irrep copies (a G-stable coordinate subspace), so a
head layout is a list of coordinate index arrays. Two layouts of the seed:

* *coupled*: ``V_r = (+)_rho R^{C_rho / h} (x) V_rho`` -- every head holds copies of every irrep;
* *irrep-wise*: ``V = (+)_rho (+)_{r=1}^{h} R^{C_rho / h} (x) V_rho`` -- each head holds one irrep
  (here ``h`` heads per irrep, so ``h * #irreps`` heads in all).

Heads of equal size go through one ``F.scaled_dot_product_attention`` call (one call for coupled,
one per head size for irrep-wise); q/k/v and the output projection are :class:`IrrepLinear`. Two
forwards, chosen at construction:

* ``components`` layout (heads in the irrep basis): q, k and v are one Schur block matmul per slab
  with the three weights stacked (:func:`~eqvit.nn.schur.apply_slabs`), one ``index_select`` lays
  the heads side by side, and one more puts the heads' outputs back in storage order for the
  Schur projection: ``(12/64) x`` timm's multiply-adds for D4 regular features.
* otherwise one stacked dense ``[3 dim, dim]`` qkv matrix (like timm) and one projection, the head
  order folded into their rows/columns; these dense matrices are built on every call.

:meth:`IrrepAttention.fold` fixes the dense weights; in the ``components`` layout the q/k/v and projection
linears fold themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import gcd

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from eqvit.nn.basis import FrameRotary, HeadBasis, IdentityBasis, NoRotary, permutation_matrix
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.schur import (
    SlabPlan,
    apply_slabs,
    autocast_as,
    autocast_dtype,
    distinct_weights,
    join_slabs,
    slab_linear_grads,
    slab_outputs,
    weights_at,
)
from eqvit.nn.sdpa import ScaledDotProductAttention


def _check_divisible(ftype: FeatureType, num_heads: int, what: str) -> None:
    """ValueError unless every irrep multiplicity of ``ftype`` splits evenly over ``num_heads``."""
    bad = [rho.name for _, rho, c, _ in ftype.blocks() if c % num_heads]
    if bad:
        raise ValueError(
            f"{what} needs every multiplicity divisible by {num_heads}; {ftype} has irreps {bad} that are not"
        )


def coupled_heads(ftype: FeatureType, num_heads: int) -> list[np.ndarray]:
    """Head r holds copies ``[r C_rho / h, (r + 1) C_rho / h)`` of every irrep."""
    _check_divisible(ftype, num_heads, f"coupled attention with {num_heads} heads")
    heads = []
    for r in range(num_heads):
        idx = []
        for i, _, c, _ in ftype.blocks():
            per = c // num_heads
            idx.append(np.sort(ftype.block_coords(i)[r * per : (r + 1) * per].reshape(-1)))  # storage order
        heads.append(np.concatenate(idx))
    return heads


def irrep_head_counts(ftype: FeatureType, irrep_heads: Mapping[str, int]) -> dict[str, int]:
    """``{irrep name: heads}`` for every irrep of ``ftype`` from a per-irrep head count.

    Names are the group's (``G.irreps[i].name``: C_n ``A, B, E1, ...``; D_n ``A1, A2, B1, B2, E1, ...``);
    the seed's ``E`` (its Table 1) is accepted for ``E1`` where that is the group's only 2-d irrep.
    ValueError for an unknown name, a missing irrep, a count < 1, or a multiplicity the count does not divide.
    """
    from eqvit.utils import unknown_name_error

    names = [rho.name for rho in ftype.irreps]
    two_d = [n for n, rho in zip(names, ftype.irreps) if rho.dim == 2]
    aliases = {"E": two_d[0]} if len(two_d) == 1 and "E" not in names else {}
    counts: dict[str, int] = {}
    for name, count in irrep_heads.items():
        key = aliases.get(name, name)
        if key not in names:
            raise unknown_name_error(f"irrep of {ftype.group.name} (irrep_heads)", name, names + list(aliases))
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"irrep_heads[{name!r}]: expected a number of heads >= 1, got {count!r}")
        counts[key] = int(count)
    present = {rho.name: c for _, rho, c, _ in ftype.blocks()}
    missing = [n for n in present if n not in counts]
    if missing:
        raise ValueError(
            f"irrep_heads gives no head count for the irreps {missing} of {ftype}; expected one for each of "
            f"{list(present)}"
        )
    bad = [f"{n}: multiplicity {present[n]}, {counts[n]} heads" for n in present if present[n] % counts[n]]
    if bad:
        raise ValueError(f"irrep_heads must divide each irrep's multiplicity in {ftype}; not so for {'; '.join(bad)}")
    return counts


def irrepwise_heads(ftype: FeatureType, num_heads: int | Mapping[str, int]) -> list[np.ndarray]:
    """Irrep-wise heads, each holding copies of one irrep only: ``num_heads`` heads per irrep (of
    ``C_rho / num_heads`` copies each), or ``{irrep name: heads}`` per irrep (:func:`irrep_head_counts`;
    the seed's Table 1 for C4 with 4q regular copies is ``{"A": 1, "B": 1, "E1": 2}``: four heads of 4q)."""
    if isinstance(num_heads, Mapping):
        counts = irrep_head_counts(ftype, num_heads)
    else:
        _check_divisible(ftype, num_heads, f"irrep-wise attention with {num_heads} heads per irrep")
        counts = {rho.name: num_heads for _, rho, _, _ in ftype.blocks()}
    heads = []
    for i, rho, c, _ in ftype.blocks():
        h = counts[rho.name]
        per = c // h
        coords = ftype.block_coords(i)  # [C_rho, d]: the coordinates of each copy, in the type's layout
        heads += [np.sort(coords[r * per : (r + 1) * per].reshape(-1)) for r in range(h)]
    return heads


def frame_heads(ftype: FeatureType, num_heads: int) -> list[np.ndarray]:
    """Frames as heads, in the frame basis of ``ftype`` (C copies of the regular representation):
    ``num_heads`` heads per frame, head (j, r) holding channels ``[r C / h, (r + 1) C / h)`` of frame j
    (coordinates of ``x @ ftype.in_frame_basis().fourier.T``). The group permutes these heads."""
    frames = _frame_type(ftype)
    C = frames.channels
    if C % num_heads:
        raise ValueError(f"frames-as-heads needs the {C} channels per frame of {ftype} divisible by {num_heads}")
    size = C // num_heads
    return [
        np.arange(j * C + r * size, j * C + (r + 1) * size) for j in range(frames.group.order) for r in range(num_heads)
    ]


def _frame_type(ftype: FeatureType) -> FeatureType:
    try:
        return ftype.in_frame_basis()
    except ValueError as err:
        raise ValueError(f"frame RoPE and frames-as-heads need copies of the regular representation: {err}") from None


HeadsFn = Callable[[FeatureType, "int | Mapping[str, int]"], list[np.ndarray]]


def _in_irrep_basis(ftype: FeatureType) -> None:
    return None


def _in_frame_basis(ftype: FeatureType) -> np.ndarray:
    return _frame_type(ftype).fourier.T


@dataclass(frozen=True)
class HeadLayout:
    """How attention splits tokens of a feature type into heads.

    ``heads(ftype, num_heads)``: the heads as coordinate arrays that partition ``ftype.dim``. ``basis(ftype)``:
    the basis ``u = x @ T`` those coordinates are in, None for the irrep basis (then every head must hold whole
    irrep copies, a G-stable subspace; :func:`check_heads`). ``counts_per_irrep``: ``num_heads`` may be
    ``{irrep name: heads}``.
    """

    heads: HeadsFn
    basis: Callable[[FeatureType], np.ndarray | None] = _in_irrep_basis
    counts_per_irrep: bool = False


_HEAD_LAYOUTS: dict[str, HeadLayout] = {}


def register_head_layout(
    name: str,
    heads: HeadsFn,
    basis: Callable[[FeatureType], np.ndarray | None] = _in_irrep_basis,
    counts_per_irrep: bool = False,
) -> HeadLayout:
    """Register an attention head layout under ``name`` (``attention=name`` in the O(2) and Platonic builders);
    ValueError when the name is taken."""
    if name in _HEAD_LAYOUTS:
        raise ValueError(f"an attention layout named {name!r} is registered already")
    _HEAD_LAYOUTS[name] = layout = HeadLayout(heads, basis, counts_per_irrep)
    return layout


def unregister_head_layout(name: str) -> None:
    """Remove a layout registered with :func:`register_head_layout`."""
    get_head_layout(name)
    del _HEAD_LAYOUTS[name]


def list_head_layouts() -> list[str]:
    """The registered layout names, in registration order."""
    return list(_HEAD_LAYOUTS)


def get_head_layout(name: str) -> HeadLayout:
    """The layout registered as ``name``; ValueError naming the registered ones otherwise."""
    from eqvit.utils import unknown_name_error

    if not isinstance(name, str) or name not in _HEAD_LAYOUTS:
        raise unknown_name_error("attention layout", name, list(_HEAD_LAYOUTS))
    return _HEAD_LAYOUTS[name]


register_head_layout("coupled", coupled_heads)
register_head_layout("irrepwise", irrepwise_heads, counts_per_irrep=True)
register_head_layout("frames", frame_heads, basis=_in_frame_basis)


def head_layout(ftype: FeatureType, num_heads: int | Mapping[str, int], attention: str) -> list[np.ndarray]:
    """The heads of the registered layout ``attention`` (coupled, irrepwise: irrep-basis coordinates; frames:
    frame-basis ones, see :func:`head_basis`). ``num_heads`` may be ``{irrep name: heads}`` for layouts that
    count heads per irrep (irrep-wise)."""
    layout = get_head_layout(attention)
    if isinstance(num_heads, Mapping) and not layout.counts_per_irrep:
        raise ValueError(f"heads per irrep (irrep_heads) need attention='irrepwise', got attention={attention!r}")
    return layout.heads(ftype, num_heads)


def head_basis(ftype: FeatureType, attention: str) -> np.ndarray | None:
    """The basis ``u = x @ T`` the heads of ``attention`` are laid out in: None (the irrep basis) for
    coupled and irrep-wise heads, the inverse Fourier transform for frames-as-heads."""
    return get_head_layout(attention).basis(ftype)


def check_partition(ftype: FeatureType, heads: Sequence[np.ndarray]) -> None:
    """ValueError unless the heads partition the ``ftype.dim`` coordinates."""
    flat = np.concatenate([np.asarray(h) for h in heads]) if len(heads) else np.zeros(0, dtype=np.int64)
    if len(flat) != ftype.dim or not np.array_equal(np.sort(flat), np.arange(ftype.dim)):
        raise ValueError(f"heads must partition the {ftype.dim} coordinates of {ftype}")


def check_heads(ftype: FeatureType, heads: Sequence[np.ndarray]) -> None:
    """ValueError unless the heads partition the coordinates into unions of whole irrep copies."""
    check_partition(ftype, heads)
    copy = ftype.copy_index
    for h in heads:
        members = np.unique(copy[h])
        if sum(len(ftype.copies[m][2]) for m in members) != len(h):
            raise ValueError("every head must hold whole irrep copies (a G-stable subspace)")


def split_heads(qkv: torch.Tensor, heads: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``qkv [B, N, 3 heads size]`` (q, k, v each with its heads side by side) -> SDPA's ``q, k, v``
    ``[B, heads, N, size]``, views when ``qkv`` is contiguous (timm's reshape)."""
    return qkv.reshape(*qkv.shape[:2], 3, heads, size).permute(2, 0, 3, 1, 4).unbind(0)


def attend_heads(qkv: torch.Tensor, groups: Sequence[tuple[int, int, int]], sdpa: nn.Module) -> torch.Tensor:
    """``qkv [B, N, 3 dim]`` (q, k, v each with the heads side by side, grouped by size) -> the heads'
    outputs ``[B, N, dim]``. ``groups`` lists ``(start, heads, size)``: heads of equal size go through
    one SDPA call (all of one size, as for coupled heads: one reshape, like timm)."""
    B, N = qkv.shape[:2]
    if len(groups) == 1:
        _, h, size = groups[0]
        return sdpa(*split_heads(qkv, h, size)).transpose(1, 2).reshape(B, N, h * size)
    q, k, v = qkv.chunk(3, dim=-1)
    outs = []
    for start, h, size in groups:
        qh, kh, vh = (t[..., start : start + h * size].unflatten(-1, (h, size)).transpose(1, 2) for t in (q, k, v))
        outs.append(sdpa(qh, kh, vh).transpose(1, 2).flatten(2))  # [B, N, h * size]
    return torch.cat(outs, dim=-1)


class IrrepAttention(nn.Module):
    """Equivariant self-attention ``[B, N, V.dim] -> [B, N, V.dim]``.

    Args:
        ftype: token feature type V.
        heads: coordinate index arrays, a G-stable orthogonal decomposition (:func:`head_layout`).
        qkv_bias: biases (trivial irrep) in q, k, v.
        attn_drop: dropout on the attention probabilities.
        fused: SDPA (True) or the explicit reference ``softmax(q k^T / sqrt(d)) v`` (False).
        basis: ``T [dim, dim]`` orthogonal: the heads are coordinates of ``x @ T`` (None: the irrep basis;
            :func:`head_basis`); folded into the q/k/v rows and the projection's columns.
        frame_rope: ``(heads, head_dim)`` of a frame RoPE scheme to apply to q and k in the frame basis
            (:class:`~eqvit.nn.basis.FrameRotary`); None: the layer takes no rotary scheme.
    """

    def __init__(
        self,
        ftype: FeatureType,
        heads: Sequence[np.ndarray],
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        fused: bool = True,
        basis: np.ndarray | None = None,
        frame_rope: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        # Heads in another basis (frames as heads) are permuted by the group, not each G-stable.
        (check_heads if basis is None else check_partition)(ftype, heads)
        self.in_type = self.out_type = ftype
        self.heads = [np.asarray(h, dtype=np.int64) for h in heads]
        self.num_heads = len(self.heads)
        self.sdpa = ScaledDotProductAttention(attn_drop, fused)
        self.q = IrrepLinear(ftype, ftype, qkv_bias)
        self.k = IrrepLinear(ftype, ftype, qkv_bias)
        self.v = IrrepLinear(ftype, ftype, qkv_bias)
        self.proj = IrrepLinear(ftype, ftype)
        # Heads sorted by size and laid side by side: ``perm`` lists their coordinates in that order.
        # It is folded into the q/k/v rows and the projection's columns, so no gathers are needed.
        sizes = sorted({len(h) for h in self.heads})
        self.head_groups = []  # (start, heads, size)
        order, start = [], 0
        for size in sizes:
            members = [h for h in self.heads if len(h) == size]
            self.head_groups.append((start, len(members), size))
            order += members
            start += len(members) * size
        perm = np.concatenate(order)
        self.register_buffer("perm", torch.from_numpy(perm), persistent=False)
        self.head_basis = IdentityBasis() if basis is None else HeadBasis(basis)
        if frame_rope is None:
            self.rotary = NoRotary()
        else:
            # q in the layout (heads side by side) -> the head basis -> the irrep basis -> frames.
            frames = _frame_type(ftype)
            T = np.eye(ftype.dim) if basis is None else np.asarray(basis)
            to_frames = permutation_matrix(perm) @ T.T @ frames.fourier.T
            self.rotary = FrameRotary(frames.group.order, frames.channels, to_frames, *frame_rope)
        self.schur = basis is None and self.q.schur
        self._impl = _schur_attention if self.schur else _dense_attention
        if self.schur:
            plan = self.q.plan
            self.qkv_plan = SlabPlan(plan.in_sizes, tuple((s, 3 * width) for s, width in plan.terms))
            # Stacked q/k/v slabs: output slab t holds q, k, v of its coordinates one after another.
            internal = np.zeros((3, ftype.dim), dtype=np.int64)
            pos = 0
            for i, rho, _c, _ in ftype.blocks():
                coords = ftype.block_coords(i)  # [C, d]
                slabs = [coords[:, a] for a in range(rho.dim)] if rho.type == "real" else [coords.T.reshape(-1)]
                for slab in slabs:
                    for t in range(3):
                        internal[t, slab] = pos + np.arange(len(slab))
                        pos += len(slab)
            self.register_buffer("qkv_index", torch.from_numpy(internal[:, perm].reshape(-1)), persistent=False)
            self.register_buffer("out_index", torch.from_numpy(np.argsort(perm)), persistent=False)
            # Coupled heads (every head the same chunk of copies of every slab): the heads are laid
            # side by side by reshapes and one cat, no gather (index_select on the last axis is slow).
            h = len(self.heads)
            coupled = len(self.head_groups) == 1 and all(c % h == 0 for _, _, c, _ in ftype.blocks())
            coupled = coupled and all(np.array_equal(a, b) for a, b in zip(self.heads, coupled_heads(ftype, h)))
            # (components d_t, copies per head c_t) of every q/k/v output slab: d_t = 1 for real type.
            self.slab_heads = (
                [
                    (1 if rho.type == "real" else rho.dim, c // h)
                    for _, rho, c, _ in ftype.blocks()
                    for _ in range(rho.dim if rho.type == "real" else 1)
                ]
                if coupled
                else None
            )
            chunks = None if self.slab_heads is None else slab_chunks(self.slab_heads, h)
            self.register_buffer("slab_chunks", chunks, persistent=False)

    def extra_repr(self) -> str:
        return f"{self.num_heads} heads of sizes {self.head_dims}, fused={self.fused}"

    @property
    def head_dims(self) -> list[int]:
        """The width of every head, in order."""
        return [len(h) for h in self.heads]

    @property
    def fused(self) -> bool:
        return self.sdpa.fused

    @property
    def attn_drop(self) -> float:
        return self.sdpa.dropout

    def stacked_weights(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """``(qkv weight [3 dim, dim], qkv bias, proj weight [dim, dim], proj bias)``, heads side by side."""
        modules = self._modules
        perm, dim, basis = self.perm, self.in_type.dim, modules["head_basis"]
        dense = [modules[name].dense() for name in ("q", "k", "v", "proj")]
        dense = [basis.rows(w, b) for w, b in dense[:3]] + [(basis.columns(dense[3][0]), dense[3][1])]
        qkv = torch.stack([w for w, _ in dense[:3]])[:, perm].reshape(3 * dim, dim)
        bias = None
        if any(b is not None for _, b in dense[:3]):
            bias = torch.stack([qkv.new_zeros(dim) if b is None else b for _, b in dense[:3]])
            bias = bias[:, perm].reshape(3 * dim)
        return qkv, bias, dense[3][0][:, perm], dense[3][1]

    def schur_qkv(self) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """``(matrices, biases)`` of the stacked q/k/v Schur slabs (``components`` layout)."""
        mods = self._modules
        weights = [mods[name].slab_weights() for name in ("q", "k", "v")]
        mats, biases = [w[0] for w in weights], [w[1] for w in weights]
        stacked = [None if ws[0] is None else torch.cat(ws, dim=0) for ws in zip(*mats)]
        bias = []
        for bs, w in zip(zip(*biases), stacked):
            if all(b is None for b in bs):
                bias.append(None)
            else:
                width = w.shape[0] // 3
                bias.append(torch.cat([w.new_zeros(width) if b is None else b for b in bs]))
        return stacked, bias

    def forward(self, x: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        """``x [B, N, dim] -> [B, N, dim]``."""
        return self._impl(self, x, rope, num_prefix_tokens)

    def fold(self) -> nn.Module:
        """The inference form: the dense qkv and projection fixed (:class:`~eqvit.nn.folded.FoldedIrrepAttention`);
        in the ``components`` layout the layer itself, its q/k/v and projection folding themselves."""
        if self.schur:
            return self
        from eqvit.nn.folded import FoldedIrrepAttention

        return FoldedIrrepAttention(self, self.stacked_weights())

    def fold_in_stream(self, basis, norm_output) -> nn.Module | None:
        """The inference form in a model whose stream is kept in ``basis`` (:mod:`eqvit.nn.stream`): ``qkv`` reads the
        folded norm's output (``norm_output``, its affine folded in), the projection writes the stream; None in the
        ``components`` layout (a dense change of basis would undo the Schur blocks)."""
        if self.schur:
            return None
        from eqvit.nn.folded import FoldedIrrepAttention

        qkv_w, qkv_b, proj_w, proj_b = self.stacked_weights()
        folded = FoldedIrrepAttention(self, (*norm_output.reading(qkv_w, qkv_b), *basis.writing(proj_w, proj_b)))
        folded.in_type = folded.out_type = None  # tokens in the stream basis: no FeatureType describes them
        return folded

    def attend_schur(
        self,
        x: torch.Tensor,
        qkv_mats: list,
        qkv_biases: list,
        proj: nn.Module,
        rope=None,
        num_prefix_tokens: int = 0,
    ) -> torch.Tensor:
        """The ``components``-layout attention with given stacked q/k/v slab matrices and projection."""
        buffers = self._buffers
        return schur_attend(
            x, self.qkv_plan, qkv_mats, qkv_biases, buffers["qkv_index"],
            buffers["out_index"], self.rotary, self.head_groups, self.sdpa, proj, rope, num_prefix_tokens,
            self.slab_heads, buffers["slab_chunks"],
        )  # fmt: skip

    def attend(
        self,
        x: torch.Tensor,
        qkv_w: torch.Tensor,
        qkv_b: torch.Tensor | None,
        proj_w: torch.Tensor,
        proj_b: torch.Tensor | None,
        rope=None,
        num_prefix_tokens: int = 0,
    ) -> torch.Tensor:
        """``x [B, N, dim] -> [B, N, dim]`` with given stacked weights (:meth:`stacked_weights` or a folded form)."""
        qkv = F.linear(x, qkv_w, qkv_b)  # [B, N, 3 dim], heads side by side in q, k and v
        qkv = self.rotary(qkv, rope, num_prefix_tokens)  # frame RoPE (in the frame basis), or unchanged
        return F.linear(attend_heads(qkv, self.head_groups, self.sdpa), proj_w, proj_b)


def schur_attend(
    x: torch.Tensor,
    plan: SlabPlan,
    mats: list,
    biases: list,
    qkv_index: torch.Tensor,
    out_index: torch.Tensor,
    rotary: nn.Module,
    groups: Sequence[tuple[int, int, int]],
    sdpa: nn.Module,
    proj: nn.Module,
    rope=None,
    num_prefix_tokens: int = 0,
    slab_heads: list[tuple[int, int]] | None = None,
    chunks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [B, N, dim] -> [B, N, dim]`` in the ``components`` layout: stacked q/k/v Schur slabs, the
    heads side by side, the heads, back to storage order, the projection (the training layer and its
    frozen form share it). With coupled heads (``slab_heads``: ``(d_t, c_t)`` per slab, ``chunks`` their
    :func:`slab_chunks`) the heads are laid out by reshapes and one ``cat`` each way; otherwise by
    ``index_select`` with ``qkv_index`` / ``out_index``."""
    if slab_heads is None:
        qkv = apply_slabs(x, plan, mats, biases).index_select(-1, qkv_index)
        qkv = rotary(qkv, rope, num_prefix_tokens)  # frame RoPE (in the frame basis), or unchanged
        return proj(attend_heads(qkv, groups, sdpa).index_select(-1, out_index))
    _, h, size = groups[0]
    lead = x.shape[:-1]
    if isinstance(rotary, NoRotary):
        rotary.check(rope)
        # q, k, v written straight into SDPA's layout, [B, h, N, size] each (:class:`_QkvHeads`)
        q, k, v = qkv_heads(x.reshape(-1, x.shape[-1]), x.shape[1], slab_heads, chunks, plan, mats, biases)
        heads = sdpa(q, k, v)
    else:
        # Slab t holds (q|k|v, component, copy): [..., 3, d, h, c] -> heads [..., 3, h, d c].
        slabs = slab_outputs(x, plan, mats, biases)
        pieces = [s.unflatten(-1, (3, d, h, c)).transpose(-3, -2).flatten(-2) for s, (d, c) in zip(slabs, slab_heads)]
        qkv = rotary(torch.cat(pieces, dim=-1).flatten(-3), rope, num_prefix_tokens)
        heads = sdpa(*split_heads(qkv, h, size))  # [B, h, N, size]
    out = project_heads(heads, slab_heads, proj.plan, *proj.slab_weights())
    return out.view(*lead, proj.plan.out_dim)


def slab_chunks(slab_heads: Sequence[tuple[int, int]], heads: int) -> torch.Tensor:
    """Where the stacked q/k/v slabs of coupled heads (``slab_heads``: ``(d_t, c_t)`` per slab) sit in the heads'
    layout ``[3, h, size]``, in chunks of ``g = gcd(c_t)`` coordinates: entry ``k`` is the chunk of that layout
    holding chunk ``k`` of the slabs' layout (slab ``t`` as ``[3, d_t, h, c_t]``). Coordinates move between the
    two layouts in runs of ``c_t``, so one gather of whole chunks reorders them."""
    g = gcd(*(c for _, c in slab_heads))
    size = sum(d * c for d, c in slab_heads)
    order, start = [], 0
    for d, c in slab_heads:
        for part in range(3):  # q, k, v
            for j in range(d):
                for head in range(heads):
                    first = (part * heads + head) * size + start + j * c
                    order += range(first // g, (first + c) // g)
        start += d * c
    return torch.tensor(order)


def qkv_heads(
    x: torch.Tensor,
    tokens: int,
    slab_heads: Sequence[tuple[int, int]],
    chunks: torch.Tensor,
    plan: SlabPlan,
    mats: Sequence[torch.Tensor | None],
    biases: Sequence[torch.Tensor | None],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The stacked q/k/v Schur slabs of coupled heads on tokens ``x [B N, dim]``, as SDPA's ``q, k, v``
    ``[B, h, N, size]`` (``tokens``: N, per image; ``chunks``: :func:`slab_chunks` of ``slab_heads``)."""
    weights, index = distinct_weights([*mats, *biases])
    return _QkvHeads.apply(x, chunks, tokens, tuple(slab_heads), plan, index, *weights)


class _QkvHeads(torch.autograd.Function):
    """:func:`qkv_heads`: the slabs' products joined once into one token-major ``[B, N, 3, h, size]`` tensor, whose
    three parts are q, k and v. Backward stacks the three gradients in that layout and gathers the slabs' gradient
    ``[B N, out]`` from it in whole chunks (:func:`slab_chunks`): two ops, where autograd through the forward's ops
    would reorder it piece by piece. Autocast: computes in the autocast dtype, as ``F.linear`` would."""

    @staticmethod
    def forward(ctx, x, chunks, tokens, slab_heads, plan: SlabPlan, index: tuple[int, ...], *weights):
        # index: per output slab its matrix, then its bias, among the distinct ``weights`` (-1: None)
        dtype = autocast_dtype(x.device.type) or x.dtype
        mats, biases = weights_at([w.to(dtype) for w in weights], index, len(plan.terms))
        slabs = slab_outputs(x.to(dtype), plan, mats, biases)
        B, N = len(x) // tokens, tokens
        h = slabs[0].shape[-1] // (3 * slab_heads[0][0] * slab_heads[0][1])
        # token-major, as timm's qkv [B, N, 3, h, size] (one cat of the slabs' pieces, each [B, N, 3, h, d c]); q, k
        # and v are transposed views of it
        pieces = [slab.view(B, N, 3, d, h, c).transpose(3, 4).flatten(-2) for slab, (d, c) in zip(slabs, slab_heads)]
        qkv = torch.cat(pieces, dim=-1) if len(pieces) > 1 else pieces[0].contiguous()
        ctx.plan, ctx.index = plan, index
        ctx.save_for_backward(x, chunks, *weights)
        return split_heads(qkv, h, qkv.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_q, grad_k, grad_v):
        x, chunks, *weights = ctx.saved_tensors
        plan = ctx.plan
        dtype = grad_q.dtype
        B, _, N, _ = grad_q.shape
        # the forward's layout [B, N, 3, h, size], then the slabs' [B N, out] (slab t as [3, d, h, c]) by one gather
        # of whole chunks (a cat of the pieces would take 3 d h pieces of c coordinates per slab)
        grad = torch.stack([g.transpose(1, 2) for g in (grad_q, grad_k, grad_v)], dim=2)
        grad = grad.view(B * N, len(chunks), -1).index_select(1, chunks).view(B * N, plan.out_dim)
        x_slabs = [[piece] for piece in x.to(dtype).split(plan.in_sizes, dim=-1)]
        cast = [w.to(dtype) for w in weights]
        grad_weights, grad_pieces = slab_linear_grads(grad, plan, ctx.index, cast, ctx.needs_input_grad[6:], x_slabs)
        grad_x = None
        if ctx.needs_input_grad[0]:
            pieces = [grad_pieces[s][0] if s in grad_pieces else None for s in range(len(plan.in_sizes))]
            grad_x = join_slabs(pieces, plan, grad).to(x.dtype)
        grad_weights = [None if g is None else g.to(w.dtype) for g, w in zip(grad_weights, weights)]
        return (grad_x, None, None, None, None, None, *grad_weights)


def project_heads(
    heads: torch.Tensor,
    slab_heads: Sequence[tuple[int, int]],
    plan: SlabPlan,
    mats: Sequence[torch.Tensor | None],
    biases: Sequence[torch.Tensor | None],
) -> torch.Tensor:
    """The projection of coupled heads' outputs, SDPA's ``[B, h, N, size]`` -> ``[B N, out]``.

    Input slab ``t`` of the projection is ``[d_t, h, c_t]`` per token in storage order, while the heads hold it as
    ``[h, N, d_t c_t]``: the slabs are a reordered copy of the heads. Autograd would keep that copy beside SDPA's
    own output; :class:`_ProjectHeads` keeps the heads alone and reorders them again in backward."""
    weights, index = distinct_weights([*mats, *biases])
    return _ProjectHeads.apply(heads, tuple(slab_heads), plan, index, *weights)


def _head_slabs(heads: torch.Tensor, slab_heads: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    """Heads ``[B, h, N, size]`` -> the projection's input slabs ``[B N, d h c]`` (storage order ``[d, h, c]``)."""
    parts = heads.split([d * c for d, c in slab_heads], dim=-1)
    return [p.unflatten(-1, dc).permute(0, 2, 3, 1, 4).flatten(0, 1).flatten(1) for p, dc in zip(parts, slab_heads)]


class _ProjectHeads(torch.autograd.Function):
    """:func:`project_heads` with its backward written out: saves the heads (SDPA's output, kept for SDPA's
    own backward anyway) instead of their reordered copy, which it rebuilds in backward (one copy). The
    backward runs under the forward's autocast state, as ``torch.amp.custom_bwd`` would."""

    @staticmethod
    def forward(ctx, heads, slab_heads, plan: SlabPlan, index: tuple[int, ...], *weights):
        # index: per output slab its matrix, then its bias, among the distinct ``weights`` (-1: None)
        mats, biases = weights_at(weights, index, len(plan.terms))
        ctx.amp_dtype = autocast_dtype(heads.device.type)
        ctx.slab_heads, ctx.plan, ctx.index = slab_heads, plan, index
        ctx.save_for_backward(heads, *weights)
        return apply_slabs(_head_slabs(heads, slab_heads), plan, mats, biases)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        heads, *weights = ctx.saved_tensors
        slab_heads = ctx.slab_heads
        with autocast_as(heads.device.type, ctx.amp_dtype):
            slabs = _head_slabs(heads, slab_heads)
            grad_weights, grad_slabs = slab_linear_grads(
                grad, ctx.plan, ctx.index, weights, ctx.needs_input_grad[4:], [[slab] for slab in slabs]
            )
            slabs = None  # free the copy before the gradient's (peak memory; `del` would stop torch.compile)
            # back to the heads' order: slab [B N, d h c] as d pieces [B, N, h, c], joined by one cat into [B, N, h,
            # size] (read in storage order) and seen as [B, h, N, size], the layout of SDPA's output
            B, h, N, _ = heads.shape
            pieces = []
            for s, (d, c) in enumerate(slab_heads):
                if s in grad_slabs:
                    pieces += grad_slabs[s][0].view(B, N, d, h, c).unbind(2)
                else:
                    pieces.append(heads.new_zeros(B, N, h, d * c))
            grad_heads = torch.cat(pieces, dim=-1).transpose(1, 2)
        return (grad_heads, None, None, None, *grad_weights)


def _dense_attention(m: IrrepAttention, x: torch.Tensor, rope, num_prefix_tokens: int) -> torch.Tensor:
    return m.attend(x, *m.stacked_weights(), rope=rope, num_prefix_tokens=num_prefix_tokens)


def _schur_attention(m: IrrepAttention, x: torch.Tensor, rope, num_prefix_tokens: int) -> torch.Tensor:
    return m.attend_schur(x, *m.schur_qkv(), m.proj, rope, num_prefix_tokens)
