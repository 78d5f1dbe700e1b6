"""Restriction of a Platonic Transformer to a subgroup H of its frames G, as a protocol.

Regular features of G restrict to multiples of H's regular representation. With the right cosets
``G = H r_0 u H r_1 u ... u H r_{m-1}`` (``m = |G:H|``, ``r_0`` the identity) every frame is
``h r_k`` exactly once, and ``f_k(h) := f(h r_k)`` transforms under ``L_h`` as H's regular
representation: ``(L_h' f)_k(h) = f(h'^-1 h r_k) = f_k(h'^-1 h)``. So a feature ``f: G -> R^C``
(``[..., |G| C]``, frame-major) *is* a feature ``H -> R^{m C}`` after a fixed permutation of the
feature axis: entry ``a * m C + k * C + c`` of the H feature is entry ``idx(h_a r_k) * C + c`` of
the G feature (:meth:`RestrictionContext.permutation`).

Every module restricts itself to H given that correspondence (escnn's
``Representation.restrict``): :func:`restrictor` registers ``fn(module, context) -> module`` per
module type, :func:`restrict_module` looks it up along the MRO, and containers (the model, blocks,
MLPs) restrict their children. The restricted module computes the same function on the permuted
features, is H-equivariant as a module of H in its own right, and has at least as many free
parameters (usually ``m`` times as many):

* group convolution ``y(g) = sum_u W(u) f(g u)``: writing ``r_k' u = h' r_k``,
  ``y_k'(h) = sum_h' sum_k W(r_k'^-1 h' r_k) f_k(h h')``, so the H kernel is
  ``W_H(h')[(k', o), (k, i)] = W(r_k'^-1 h' r_k)[o, i]`` (:func:`restrict_group_conv`);
* lifting tokenizers: channel ``(k, c)`` of H frame h is channel c of G frame ``h r_k``, so the
  kernel (image patches) or the vector weights (points, sphere poses) are turned by ``r_k``;
* frame RoPE: channel block k of H frame h rotates like G frame ``h r_k``:
  ``omega . (h r_k)^-1 p = (r_k omega) . h^-1 p``, a frame RoPE of H with the frequencies turned by
  each ``r_k`` (frames-as-heads: ``m H`` heads per H frame; invariant scores: H heads of ``m D``);
* attention: frames-as-heads stay independent heads; with invariant scores each head's score sums
  over all G frames, i.e. over H's frames and the ``m`` cosets;
* LayerNorm, LayerScale: the per-channel parameters repeated over the cosets;
* heads: pooling over G's frames is pooling over H's frames and the cosets.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.models.restriction import (
    Restriction,
    as_parameter,
    restrict_module,
    restricted_model,
    restrictor,
)
from eqvit.models.vit import EquivariantViT
from eqvit.nn.basis import AttentionInBasis, FrameRotary, permutation_matrix
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.platonic import (
    FramePool,
    FramePoolDense,
    InvariantPoolHead,
    PlatonicAttention,
    PlatonicMlp,
)
from eqvit.nn.posenc.frame_rope import FrameRoPE
from eqvit.nn.posenc.invariant import FrameInvariantAPE
from eqvit.nn.regular import FOURIER_COST_RATIO, GroupConvLinear, LiftToGroup, RegularLayerNorm, RegularLayerScale
from eqvit.nn.tokenizers.platonic import (
    LiftedIcosphereEmbed,
    LiftedPointEmbed,
    LiftedSquarePatchEmbed,
)
from eqvit.utils import unknown_name_error

Layout = tuple[np.ndarray, np.ndarray]  # per H-frame channel j: (coset k_j, G channel c_j)


# ------------------------------------------------------------------------------------------------
# subgroups of the 3-D frames by name


def _structure_name(group: FiniteGroup, indices: np.ndarray) -> str:
    """``C{n}``, ``D{n}``, ``T``, ``O`` or ``I`` for a subgroup of a 3-D rotation group."""
    n = len(indices)
    orders = group.element_orders[indices]
    if orders.max() == n:
        return f"C{n}"
    if n == 12 and orders.max() == 3:
        return "T"
    if n == 24 and orders.max() == 4:
        return "O"
    if n == 60:
        return "I"
    if n % 2 == 0 and (orders == n // 2).any():
        return f"D{n // 2}"
    return f"{group.name}>H{n}"


def spatial_subgroup_names(group: FiniteGroup) -> dict[str, np.ndarray]:
    """``{name: indices}``, one subgroup per conjugacy class of a 3-D rotation group (T, O, I, ...).

    Classes are named by structure (``C2``, ``C3``, ``D2``, ``D3``, ``T``, ...); when several classes
    share a structure (O has two classes of C2 and of D2), the later ones (in size, then index order)
    are ``C2[2]``, ``C2[3]``, ... The whole group keeps its own name.
    """
    names: dict[str, np.ndarray] = {}
    for idx in group.subgroups():
        base = group.name if len(idx) == group.order else _structure_name(group, idx)
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}[{n}]"
        names[name] = idx
    return names


def find_spatial_subgroup(group: FiniteGroup, subgroup: str) -> FiniteGroup:
    """The subgroup of the 3-D ``group`` called ``subgroup`` (``"T"``, ``"D2"``, ``"C3"``, ...)."""
    names = spatial_subgroup_names(group)
    if subgroup == "trivial":
        subgroup = "C1"
    if subgroup not in names:
        raise unknown_name_error(f"subgroup of {group.name}", subgroup, list(names))
    return group.subgroup(names[subgroup], name=subgroup)


# ------------------------------------------------------------------------------------------------
# the context: cosets and the feature permutation


class RestrictionContext(Restriction):
    """G, H, the right-coset representatives and the maps between G and H regular features.

    Attributes:
        G: the frames of the model being restricted.
        H: the subgroup (``H.parent is G``).
        cosets: ``[m]`` G indices of the representatives ``r_k`` of the right cosets ``H r_k``.
        element: ``[|H|, m]`` G index of ``h_a r_k``; a permutation of G's indices.
        scores: the attention layout of the model (``"frames"`` or ``"invariant"``), which fixes how
            frame RoPE's heads are laid out.
    """

    def __init__(
        self, G: FiniteGroup, H: FiniteGroup, cosets: np.ndarray, element: np.ndarray, scores: str = "frames"
    ) -> None:
        super().__init__(G, H)
        self.cosets, self.element, self.scores = cosets, element, scores

    @classmethod
    def build(cls, G: FiniteGroup, H: FiniteGroup, scores: str = "frames", cosets=None) -> RestrictionContext:
        """The context for ``H`` in ``G``; ``cosets`` (right-coset representatives) defaults to the
        first element of each coset in G's order (the identity first)."""
        if H.parent is not G:
            raise ValueError(f"{H!r} is not a subgroup taken from {G!r} (use find_subgroup)")
        sub = H.parent_indices
        if cosets is None:
            covered = np.zeros(G.order, dtype=bool)
            reps = []
            for g in range(G.order):
                if not covered[g]:
                    reps.append(g)
                    covered[G.cayley[sub, g]] = True
            cosets = np.array(reps, dtype=np.int64)
        cosets = np.asarray(cosets, dtype=np.int64)
        element = G.cayley[sub[:, None], cosets[None, :]]  # h_a r_k
        if sorted(element.ravel().tolist()) != list(range(G.order)):
            raise ValueError(f"{cosets.tolist()} are not representatives of the right cosets of {H.name} in {G.name}")
        return cls(G, H, cosets, element, scores)

    @property
    def index(self) -> int:
        """``m = |G:H|``."""
        return len(self.cosets)

    def standard_layout(self, channels: int, groups: int = 1) -> Layout:
        """The layout of ``groups x channels`` G channels per frame (q/k/v: groups = 3) as H channels
        ``(group s, coset k, channel c)``: G channel ``s * channels + c`` of frame ``h r_k``."""
        s, k, c = np.meshgrid(np.arange(groups), np.arange(self.index), np.arange(channels), indexing="ij")
        return k.ravel(), (s * channels + c).ravel()

    def permutation(self, channels: int, layout: Layout | None = None) -> np.ndarray:
        """``perm [|G| C]``: the H feature is ``x_G[..., perm]`` (``channels`` = C per G frame)."""
        coset, chan = self.standard_layout(channels) if layout is None else layout
        return (self.element[:, coset] * channels + chan[None, :]).ravel()

    def to_h(self, x: torch.Tensor, layout: Layout | None = None) -> torch.Tensor:
        """G regular features ``[..., |G| C]`` -> the same features as H features ``[..., |H| m C]``."""
        perm = torch.as_tensor(self.permutation(x.shape[-1] // self.G.order, layout), device=x.device)
        return x.index_select(-1, perm)

    def feature_type(self, channels: int) -> FeatureType:
        """The restricted type of ``FeatureType.frames(G, channels)``: ``FeatureType.frames(H, m C)``."""
        return FeatureType.frames(self.H, self.index * channels)

    def restricted_type(self, ftype: FeatureType) -> FeatureType:
        if ftype.basis != "frames":
            raise ValueError(f"a Platonic restriction maps frame features, got {ftype}")
        return self.feature_type(ftype.channels)

    def kernel_index(self) -> np.ndarray:
        """``[m, |H|, m]``: G index of ``r_k'^-1 h_a r_k`` (which G kernel value sits where in the H kernel)."""
        G = self.G
        return G.cayley[G.inverse[self.cosets][:, None, None], self.element[None, :, :]]

    def turned(self, vectors: np.ndarray) -> np.ndarray:
        """``[m, ..., d]``: ``R_{r_k} v`` for each coset k and each vector ``v [..., d]``."""
        return np.einsum("kij,...j->k...i", self.G.elements[self.cosets], vectors)


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


# ------------------------------------------------------------------------------------------------
# layers on regular features


def _auto_impl(layer: GroupConvLinear) -> str:
    """``"auto"`` unless ``layer`` was built with a forced implementation other than auto's choice."""
    chosen = "fourier" if layer.fourier_cost() < FOURIER_COST_RATIO * layer.cayley_cost() else "cayley"
    return "auto" if layer.impl == chosen else layer.impl


def restrict_group_conv(
    layer: GroupConvLinear,
    context: RestrictionContext,
    in_layout: Layout | None = None,
    out_layout: Layout | None = None,
) -> GroupConvLinear:
    """The H group convolution with ``W_H(h_a)[j', j] = W(r_k'^-1 h_a r_k)[o, i]``, where H channel j is
    ``(k, i) = in_layout[j]`` and j' is ``(k', o) = out_layout[j']`` (default: ``(k, c) -> k C + c``)."""
    in_k, in_c = in_layout or context.standard_layout(layer.in_channels)
    out_k, out_c = out_layout or context.standard_layout(layer.out_channels)
    new = GroupConvLinear(context.H, len(in_k), len(out_k), bias=layer.bias is not None, impl=_auto_impl(layer))
    kidx = context.kernel_index()  # [m, |H|, m]
    u = kidx[out_k[None, :, None], np.arange(context.H.order)[:, None, None], in_k[None, None, :]]
    dev = layer.weight.device
    gathered = layer.weight.detach()[
        torch.as_tensor(u, device=dev),
        torch.as_tensor(out_c[None, :, None], device=dev),
        torch.as_tensor(in_c[None, None, :], device=dev),
    ]  # [|H|, m O, m I]
    new.weight = as_parameter(gathered, layer.weight)
    if layer.bias is not None:
        new.bias = as_parameter(layer.bias.detach()[torch.as_tensor(out_c, device=dev)], layer.bias)
    return new.to(device=layer.weight.device, dtype=layer.weight.dtype)


@restrictor(GroupConvLinear, kind=RestrictionContext)
def _restrict_group_conv(layer: GroupConvLinear, context: RestrictionContext) -> GroupConvLinear:
    return restrict_group_conv(layer, context)


@restrictor(RegularLayerNorm, kind=RestrictionContext)
def _restrict_layer_norm(norm: RegularLayerNorm, context: RestrictionContext) -> RegularLayerNorm:
    new = RegularLayerNorm(context.H, context.index * norm.channels, norm.eps)
    new.weight = as_parameter(norm.weight.detach().repeat(context.index), norm.weight)
    new.bias = as_parameter(norm.bias.detach().repeat(context.index), norm.bias)
    return new


@restrictor(RegularLayerScale, kind=RestrictionContext)
def _restrict_layer_scale(scale: RegularLayerScale, context: RestrictionContext) -> RegularLayerScale:
    new = RegularLayerScale(context.H, context.index * scale.gamma.numel())
    new.gamma = as_parameter(scale.gamma.detach().repeat(context.index), scale.gamma)
    return new


@restrictor(PlatonicMlp, kind=RestrictionContext)
def _restrict_mlp(mlp: PlatonicMlp, context: RestrictionContext) -> PlatonicMlp:
    m = context.index
    new = PlatonicMlp(context.H, m * mlp.fc1.in_channels, m * mlp.fc1.out_channels)
    new.fc1, new.fc2 = restrict_module(mlp.fc1, context), restrict_module(mlp.fc2, context)
    new.act, new.drop = restrict_module(mlp.act, context), restrict_module(mlp.drop, context)
    return new


class ChunkedLayerNorm(nn.Module):
    """A LayerNorm over ``D`` applied to each of the ``m`` chunks of a ``[..., m D]`` head: the qk-norm of
    a G head of size D, after restriction put ``m`` of them (one per coset) into one H head."""

    def __init__(self, norm: nn.LayerNorm, chunks: int) -> None:
        super().__init__()
        self.norm, self.chunks = norm, chunks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.unflatten(-1, (self.chunks, -1))).flatten(-2)


@restrictor(PlatonicAttention, kind=RestrictionContext)
def _restrict_attention(attn: PlatonicAttention, context: RestrictionContext) -> PlatonicAttention:
    """Frames as heads: the ``|G| H`` heads become ``|H|`` frames x ``m H`` heads (channels ``(k, head, d)``).
    Invariant scores: each of the H heads sums over all G frames, i.e. over H's frames and the cosets, so
    an H head holds ``m D`` channels ``(head, k, d)``."""
    m, C, nh, D = context.index, attn.channels, attn.num_heads, attn.head_dim
    frames = attn.scores == "frames"
    heads = m * nh if frames else nh
    qk_norm = not isinstance(attn.q_norm, nn.Identity)
    new = PlatonicAttention(
        context.H, m * C, heads, qkv_bias=attn.qkv.bias is not None, qk_norm=qk_norm, scores=attn.scores
    )
    if frames:  # per H frame: (k, head, d) = G channel head * D + d of frame h r_k
        k, hd, d = np.meshgrid(np.arange(m), np.arange(nh), np.arange(D), indexing="ij")
    else:  # per H frame: (head, k, d)
        hd, k, d = np.meshgrid(np.arange(nh), np.arange(m), np.arange(D), indexing="ij")
    layout = (k.ravel(), (hd * D + d).ravel())
    qkv_layout = (np.tile(layout[0], 3), np.concatenate([s * C + layout[1] for s in range(3)]))
    new.qkv = restrict_group_conv(attn.qkv, context, out_layout=qkv_layout)
    new.proj = restrict_group_conv(attn.proj, context, in_layout=layout)
    for name in ("q_norm", "k_norm"):
        norm = copy.deepcopy(getattr(attn, name))
        if isinstance(norm, nn.LayerNorm) and not frames:
            norm = ChunkedLayerNorm(norm, m)
        elif not isinstance(norm, (nn.LayerNorm, nn.Identity)):
            raise ValueError(f"no restriction is known for the qk-norm {type(norm).__name__}")
        setattr(new, name, norm)
    new.sdpa, new.proj_drop = copy.deepcopy(attn.sdpa), copy.deepcopy(attn.proj_drop)
    return new


@restrictor(FrameRoPE, kind=RestrictionContext)
def _restrict_frame_rope(rope: FrameRoPE, context: RestrictionContext) -> FrameRoPE:
    """Block k of H frame h turns like G frame ``h r_k``: H's frame RoPE with frequencies ``r_k omega``."""
    m, nh, D = context.index, rope.num_heads, rope.head_dim
    turned = context.turned(_f64(rope.freqs).numpy())  # [m, H, D/2, d]
    if context.scores == "frames":  # heads (k, head), each of D
        freqs, heads, head_dim = turned.reshape(m * nh, D // 2, -1), m * nh, D
    else:  # heads `head`, each of m D: pairs (k, pair)
        freqs, heads, head_dim = turned.transpose(1, 0, 2, 3).reshape(nh, m * D // 2, -1), nh, m * D
    positions = rope.exact_buffer("positions") if rope.fixed_positions else None
    new = FrameRoPE(context.H, heads, head_dim, positions=positions, learnable=rope.learnable)
    freqs = torch.from_numpy(np.ascontiguousarray(freqs))
    if rope.learnable:
        new.freqs = as_parameter(freqs, rope.freqs)
    else:
        new.freqs = freqs  # an exact buffer: the assignment replaces its float64 master
        if rope.fixed_positions:
            cos, sin = FrameRoPE._cos_sin(positions, freqs, torch.from_numpy(context.H.elements.copy()))
            new.rotation = torch.stack([cos, sin], dim=-1)
    return new.to(dtype=rope.freqs.dtype, device=rope.freqs.device)


@restrictor(AttentionInBasis, kind=RestrictionContext)
def _restrict_attention_in_basis(attn: AttentionInBasis, context: RestrictionContext) -> AttentionInBasis:
    """Irrep-wise heads on frame features: the inner attention restricted as an irrep-feature layer.

    The inner layer reads ``x_G A`` (``A`` the G Fourier transform); with ``x_G = x_H P`` (the frame
    permutation) and the inner restriction ``v -> v R^T``, the restricted inner layer reads
    ``x_H P A R^T``. Its frame RoPE rotates G's frames ``(h r_k, c)``, which are H's frames with channels
    ``(k, c)``: the same permutation takes it to the restricted model's (H) rope.
    """
    from eqvit.models.restrict_irreps import IrrepRestriction

    inner = attn.inner
    irreps = IrrepRestriction.build(context.G, context.H, inner.in_type, inner.heads)
    new_inner = restrict_module(inner, irreps)
    _, R = irreps.map(inner.in_type)
    C = attn.in_type.channels
    P = permutation_matrix(context.permutation(C))  # x_H @ P = x_G
    rotary = new_inner.rotary
    if isinstance(rotary, FrameRotary):
        to_h_frames = rotary.exact_buffer("to_frames").numpy() @ P.T  # layout -> G frames -> H frames
        new_inner.rotary = FrameRotary(
            context.H.order, context.index * C, to_h_frames, context.index * rotary.rope_heads, rotary.rope_head_dim
        )
    to_inner = P @ attn.exact_buffer("to_inner").numpy() @ R.T
    return AttentionInBasis(new_inner, context.feature_type(C), to_inner=to_inner)


@restrictor(FrameInvariantAPE, kind=RestrictionContext)
def _restrict_frame_ape(ape: FrameInvariantAPE, context: RestrictionContext) -> FrameInvariantAPE:
    """The encoding seen as H features (``p_H = p_G P^T``), re-expanded in H's (larger) invariant basis."""
    C = ape.frame_type.channels
    new = FrameInvariantAPE(context.H, ape.centers, context.feature_type(C)).double()
    new.load_embedding_(_f64(ape.embedding())[:, context.permutation(C)])
    return new


# ------------------------------------------------------------------------------------------------
# tokenizers


def _tiled_linear(linear: nn.Linear, context: RestrictionContext, weight: np.ndarray | None = None) -> nn.Linear:
    """``Linear(in, m C)`` whose output block k is ``linear`` (or ``weight[k]`` ``[m, C, in]``)."""
    m = context.index
    new = nn.Linear(linear.in_features, m * linear.out_features, bias=linear.bias is not None)
    w = (
        linear.weight.detach().repeat(m, 1)
        if weight is None
        else torch.from_numpy(weight.reshape(-1, weight.shape[-1]))
    )
    new.weight = as_parameter(w, linear.weight)
    if linear.bias is not None:
        new.bias = as_parameter(linear.bias.detach().repeat(m), linear.bias)
    return new


@restrictor(LiftToGroup, kind=RestrictionContext)
def _restrict_lift(lift: LiftToGroup, context: RestrictionContext) -> LiftToGroup:
    return LiftToGroup(context.H).to(dtype=lift.frames.dtype, device=lift.frames.device)


@restrictor(LiftedSquarePatchEmbed, kind=RestrictionContext)
def _restrict_square_embed(embed: LiftedSquarePatchEmbed, context: RestrictionContext) -> LiftedSquarePatchEmbed:
    """Channel ``(k, c)``'s kernel is ``W_c(r_k^-1 u)``: frame ``h`` of it reads ``W_c((h r_k)^-1 v)``."""
    m, C = context.index, embed.channels
    new = LiftedSquarePatchEmbed(context.H, embed.img_size, embed.patch_size, embed.in_chans, m * C)
    steer = embed.steer[torch.as_tensor(context.cosets, device=embed.steer.device)]  # [m, P^2]: pixel r_k^-1 u
    weight = embed.weight.detach()[:, :, steer]  # [C, C_in, m, P^2]
    new.weight = as_parameter(weight.permute(2, 0, 1, 3).reshape(m * C, embed.in_chans, -1), embed.weight)
    new.bias = as_parameter(embed.bias.detach().repeat(m), embed.bias)
    return new


@restrictor(LiftedPointEmbed, kind=RestrictionContext)
def _restrict_point_embed(embed: LiftedPointEmbed, context: RestrictionContext) -> LiftedPointEmbed:
    """``V_c . (h r_k)^-1 p = (r_k V_c) . h^-1 p``: the vector weights turned by each ``r_k``."""
    m = context.index
    new = LiftedPointEmbed(context.H, embed.scalar_proj.in_features, m * embed.scalar_proj.out_features)
    new.scalar_proj = _tiled_linear(embed.scalar_proj, context)
    new.vector_proj = _tiled_linear(embed.vector_proj, context, context.turned(_f64(embed.vector_proj.weight).numpy()))
    like = embed.scalar_proj.weight
    return new.to(device=like.device, dtype=like.dtype)


@restrictor(LiftedIcosphereEmbed, kind=RestrictionContext)
def _restrict_icosphere_embed(embed: LiftedIcosphereEmbed, context: RestrictionContext) -> LiftedIcosphereEmbed:
    """The invariant scalars repeated over the cosets, the pose-axis weights turned by each ``r_k``."""
    lifting = embed.embed.lifting
    new = LiftedIcosphereEmbed(
        context.H, embed.embed.in_chans, context.index * embed.embed.proj.out_features, lifting.input_level,
        lifting.patch_level,
    )  # fmt: skip
    new.embed.proj = _tiled_linear(embed.embed.proj, context)
    axes = _f64(embed.axes_proj.weight).numpy().reshape(-1, 2, 3)  # [C, 2 axes, 3]
    new.axes_proj = _tiled_linear(embed.axes_proj, context, context.turned(axes).reshape(context.index, -1, 6))
    return new.to(dtype=embed.seen_axes.dtype, device=embed.seen_axes.device)


# ------------------------------------------------------------------------------------------------
# heads


@restrictor(FramePool, kind=RestrictionContext)
def _restrict_frame_pool(pool: FramePool, context: RestrictionContext) -> FramePool:
    """Pooling over G's frames is pooling over H's frames and the cosets: ``(a, k)`` is frame ``a m + k``
    of the ``|H| m = |G|`` groups of channels, so the pool itself is unchanged (it keeps its order)."""
    return FramePool(pool.order, pool.mode)


@restrictor(InvariantPoolHead, kind=RestrictionContext)
def _restrict_pool_head(head: InvariantPoolHead, context: RestrictionContext) -> InvariantPoolHead:
    """The lift restricted; the pooling runs over H's frames and the cosets. With mean pooling and a
    classifier, the pooling over cosets folds into a classifier on all ``m K`` H-invariants (more freedom)."""
    m, K = context.index, head.lift.out_channels
    drop = head.drop.p
    if head.pool_mode == "mean" and isinstance(head.fc, nn.Linear):
        # The mean over G's frames of a linear map is a linear map of the m K H-invariants (copies averaged).
        new = InvariantPoolHead(context.H, m * head.lift.in_channels, head.fc.out_features, m * K, drop, "mean")
        new.fc.weight = as_parameter(head.fc.weight.detach().repeat(1, m) / m, head.fc.weight)
        if head.fc.bias is not None:
            new.fc.bias = as_parameter(head.fc.bias.detach().clone(), head.fc.bias)
        else:
            new.fc.bias = None
    else:
        new = InvariantPoolHead(context.H, m * head.lift.in_channels, 0, m * K, drop, head.pool_mode)
        # Pooled over H's frames and the cosets at once: the |G| groups of K channels, as before.
        new.pool, new.num_features = restrict_module(head.pool, context), head.num_features
        new.fc, new.num_classes = copy.deepcopy(head.fc), head.num_classes
    new.lift = restrict_module(head.lift, context)
    return new


@restrictor(FramePoolDense, kind=RestrictionContext)
def _restrict_pool_dense(head: FramePoolDense, context: RestrictionContext) -> FramePoolDense:
    new = FramePoolDense(context.H.order, copy.deepcopy(head.head))
    new.pool = restrict_module(head.pool, context)
    return new


# ------------------------------------------------------------------------------------------------
# models


def is_platonic(model: nn.Module) -> bool:
    """Whether ``model``'s tokens are functions on frames (``platonic_*``, or a restriction of one)."""
    return isinstance(model, EquivariantViT) and getattr(model.token_type, "basis", None) == "frames"


def _scores(attn: nn.Module) -> str:
    """How frame RoPE's heads are laid out for ``attn``: per frame (frames as heads, and the irrep-wise
    heads whose frame RoPE rotates frames-major heads) or over all frames (coupled, invariant scores)."""
    return attn.scores if isinstance(attn, PlatonicAttention) else "frames"


def _symmetry(model: nn.Module, H: FiniteGroup) -> FiniteGroup:
    """The restricted model's group: ``H`` where the model kept all of its frames' symmetry, else the
    elements of ``model.group`` that lie in ``H`` (a subgroup of H)."""
    G, sym = model.frames, model.group
    if sym is G:
        return H
    inside = np.zeros(H.order, dtype=bool)
    for R in sym.elements:
        inside[np.abs(H.elements - R).max(axis=(1, 2)) < 1e-9] = True
    if inside.all():
        return H
    return H.subgroup(np.flatnonzero(inside), name=f"{sym.name}&{H.name}")


def restrict_platonic(model: nn.Module, subgroup: str | FiniteGroup | np.ndarray, cosets=None) -> nn.Module:
    """A Platonic Transformer on the frames ``subgroup`` of ``model.frames`` computing the same function.

    Args:
        model: a ``platonic_*`` model (or a restriction of one).
        subgroup: a subgroup name of ``model.frames`` (``"C4"``, ``"D2"`` for images; ``"T"``, ``"D2"``,
            ``"C3"``, ... for 3-D frames, see :func:`spatial_subgroup_names`), or a FiniteGroup taken
            from it, or its element indices.
        cosets: right-coset representatives (G indices); the default takes the first of each coset.

    Returns:
        A new model (same dtype, device and train/eval mode) with ``.frames`` the subgroup, ``.group``
        the symmetry it keeps, and ``|G:H|`` times the channels per frame.
    """
    from eqvit.models.platonic import on_frame_stream
    from eqvit.models.restrict import find_subgroup

    model = on_frame_stream(model)  # restriction acts on frame features
    G = model.frames
    H = find_subgroup(G, subgroup)
    scores = {_scores(blk.attn) for blk in model.blocks}
    if len(scores) > 1:
        raise ValueError(f"restrict() expects the same attention scores in every block, got {sorted(scores)}")
    context = RestrictionContext.build(G, H, scores.pop() if scores else "frames", cosets)
    like = next(model.parameters())
    with torch.no_grad():
        new = restrict_module(model, context)
    return new.to(device=like.device, dtype=like.dtype)


@restrictor(EquivariantViT, kind=RestrictionContext)
def _restrict_model(model: nn.Module, context: RestrictionContext) -> nn.Module:
    """The model of the restricted components: H's frames (``|G:H|`` times the channels) and the symmetry it
    keeps."""
    G, H = context.G, context.H
    token_type = context.feature_type(model.token_type.channels)
    return restricted_model(model, context, _symmetry(model, H), token_type, group=H.name, restricted_from=G.name)
