"""Restriction of irrep-feature models (the O(2)-subgroup ViTs) to a subgroup (O(2) seed, Theorem 2, Lemma 2, App. E).

Every feature space ``V = (+)_rho R^{C_rho} (x) V_rho`` of G is mapped to ``W = (+)_sigma R^{D_sigma} (x)
W_sigma`` of H by an H-equivariant isometry ``R`` built copy by copy (each G-irrep copy restricts to a few
H-irrep copies, ``Representation.from_matrices`` on ``rho(H)``): :class:`IrrepRestriction`. Every module
restricts itself through the protocol of :mod:`eqvit.models.restriction`:

* an equivariant affine map ``f(x) = A x + b`` becomes ``R' A R^T y + R' b`` (Lemma 2), projected onto
  H's parametrisation of eq. 4-5 (the projection is exact; a residual is an error);
* attention heads are the images of G's heads: in the irrep basis the copies of W are ordered so that
  G's coupled heads map onto W's coupled heads (the ``Phi`` of Step 2); heads laid out in another basis
  ``u = x T`` (frames as heads) keep their coordinates, read through ``u = y R T``; frame RoPE keeps
  rotating G's frames (it is G-equivariant, hence H-equivariant), reached from the new layout;
* the MLP's G-set X is viewed as an H-set (a union of H-orbits, the ``m_beta`` of Theorem 2); its
  Fourier basis is the G one composed with ``R'`` (an H-Fourier basis of C(X));
* the patch embedding uses H's own filter basis of C(U) (Step 1), the APE H's invariant basis;
* LayerNorm centres the image of G's trivial channels, and the head takes the norms of the images of
  G's irrep copies (these keep the function identical; with H's own groupings it would change).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from functools import cache

import numpy as np
import torch
from torch import nn

from eqvit.geometry.domain import symmetry_subgroup
from eqvit.groups import FiniteGroup, Representation
from eqvit.models.restriction import Restriction, restrict_module, restricted_model, restrictor
from eqvit.models.vit import EquivariantViT
from eqvit.nn.activation import FourierActivation
from eqvit.nn.basis import FrameRotary, HeadBasis, IdentityBasis
from eqvit.nn.irrep_attention import IrrepAttention
from eqvit.nn.irrep_blocks import IrrepMlp, TokenInvariants
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.posenc.frame_rope import FrameRoPE
from eqvit.nn.posenc.invariant import InvariantAPE
from eqvit.nn.tokenizers.hexagonal import HexPatchTokenizer
from eqvit.nn.tokenizers.planar import PlanarTokenizer
from eqvit.nn.tokenizers.square import SquarePatchTokenizer


@cache
def _restricted_irrep(rho_matrices_key: bytes, shape: tuple[int, ...], H: FiniteGroup) -> tuple[list, np.ndarray]:
    matrices = np.frombuffer(rho_matrices_key, dtype=np.float64).reshape(shape)
    rep = Representation.from_matrices(H, matrices)
    if shape[1] == 1:  # a 1-d irrep restricts to one 1-d irrep with the identity as intertwiner
        return rep.irreps, np.ones((1, 1))
    return rep.irreps, rep.change_of_basis


def restriction_map(
    V: FeatureType, H: FiniteGroup, heads: Sequence[np.ndarray] | None = None
) -> tuple[FeatureType, np.ndarray]:
    """``(W, R)``: the H feature type of ``V`` and the isometry ``R [W.dim, V.dim]`` (``w = R v``).

    ``R rho_V(h) = rho_W(h) R`` for h in H. The copies of each H-irrep are ordered by (head of
    their G copy, G irrep, G copy, position), so coupled heads map onto coupled heads.
    """
    G = V.group
    if H.parent is not G:
        raise ValueError(f"{H!r} is not a subgroup taken from {G!r}")
    if V.basis != "irrep":
        raise ValueError(f"restriction_map reads irrep-basis features, got {V}")
    head_of = np.zeros(V.dim, dtype=np.int64)
    for r, h in enumerate(heads or []):
        head_of[h] = r
    h_names = [s.name for s in H.irreps]
    entries = []  # (key, sigma index, v coords, Q columns)
    for i, rho, _, _ in V.blocks():
        mats = np.ascontiguousarray(rho.matrices[H.parent_indices])
        sigmas, Q = _restricted_irrep(mats.tobytes(), mats.shape, H)
        for k, v in enumerate(V.block_coords(i)):  # copy k's coordinates, in V's layout
            col = 0
            for j, sigma in enumerate(sigmas):
                entries.append(((head_of[v[0]], i, k, j), h_names.index(sigma.name), v, Q[:, col : col + sigma.dim]))
                col += sigma.dim
    counts = [0] * len(h_names)
    for _, s, _, _ in entries:
        counts[s] += 1
    W = FeatureType(H, counts, layout=V.layout)
    coords = [W.block_coords(s) for s in range(len(h_names))]  # [D_sigma, d_sigma] per H irrep
    R = np.zeros((W.dim, V.dim))
    next_copy = [0] * len(h_names)
    for _, s, v, Qj in sorted(entries, key=lambda e: e[0]):
        R[np.ix_(coords[s][next_copy[s]], v)] = Qj.T
        next_copy[s] += 1
    return W, R


class IrrepRestriction(Restriction):
    """G, H and the isometries ``R_V`` of every irrep feature type V met (one per type, memoised).

    The token type's map is built from the attention heads of the model (so that coupled heads map onto
    coupled heads); every other type (the MLP's hidden features) takes the default copy order.
    """

    def __init__(self, G: FiniteGroup, H: FiniteGroup) -> None:
        super().__init__(G, H)
        self.maps: dict[FeatureType, tuple[FeatureType, np.ndarray]] = {}

    @classmethod
    def build(
        cls, G: FiniteGroup, H: FiniteGroup, token_type: FeatureType, heads: Sequence[np.ndarray] | None = None
    ) -> IrrepRestriction:
        """The restriction with the token type's map ordered by ``heads`` (irrep-basis coordinates)."""
        new = cls(G, H)
        new.maps[token_type] = restriction_map(token_type, H, heads)
        return new

    def map(self, V: FeatureType) -> tuple[FeatureType, np.ndarray]:
        """``(W, R)`` for the G type ``V`` (:func:`restriction_map`)."""
        if V not in self.maps:
            self.maps[V] = restriction_map(V, self.H)
        return self.maps[V]

    def restricted_type(self, ftype: FeatureType) -> FeatureType:
        return self.map(ftype)[0]


def _f64(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to("cpu", torch.float64).numpy()


def _support(R: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """W coordinates that the V coordinates ``coords`` map to."""
    return np.flatnonzero(np.abs(R[:, coords]).max(axis=1) > 1e-12)


# ------------------------------------------------------------------------------------------------
# layers


@restrictor(IrrepLinear, kind=IrrepRestriction)
def _restrict_linear(layer: IrrepLinear, r: IrrepRestriction) -> IrrepLinear:
    """``R' A R^T``, ``R' b`` (Lemma 2), projected onto H's irrep-wise parametrisation."""
    (W_in, R_in), (W_out, R_out) = r.map(layer.in_type), r.map(layer.out_type)
    b = layer.bias_vector()
    b = np.zeros(layer.out_type.dim) if b is None else _f64(b)
    new = IrrepLinear(W_in, W_out, bias=layer.bias is not None).double()
    new.load_dense_(R_out @ _f64(layer.weight_matrix()) @ R_in.T, R_out @ b)
    return new


@restrictor(IrrepLayerNorm, kind=IrrepRestriction)
def _restrict_norm(norm: IrrepLayerNorm, r: IrrepRestriction) -> IrrepLayerNorm:
    """Centred on the image of G's centring coordinates; each W copy scaled like the G copy it comes from."""
    V = norm.in_type
    W, R = r.map(V)
    center = np.flatnonzero(_f64(norm.exact_buffer("center_weights")) > 0)
    new = IrrepLayerNorm(W, eps=norm.eps, center=_support(R, center)).double()
    gamma_v = _f64(norm.weight)[V.copy_index]  # per coordinate
    gamma_w = gamma_v[np.abs(R).argmax(axis=1)]  # each W coordinate comes from one G copy
    beta_v = np.zeros(V.dim)
    beta_v[norm.bias_index.cpu().numpy()] = _f64(norm.bias)
    beta_w = R @ beta_v
    new.weight.copy_(torch.as_tensor(gamma_w[[idx[0] for _, _, idx in W.copies]]))
    new.bias.copy_(torch.as_tensor(beta_w[W.trivial_index]))
    rest = beta_w.copy()
    rest[W.trivial_index] = 0
    if np.abs(rest).max(initial=0) > 1e-9:
        raise ValueError("LayerNorm bias does not restrict into the trivial irreps")
    return new


@restrictor(FourierActivation, kind=IrrepRestriction)
def _restrict_activation(act: FourierActivation, r: IrrepRestriction) -> FourierActivation:
    """X viewed as an H-set: the G Fourier basis of C(X) composed with ``R'^T``."""
    W, R = r.map(act.in_type)
    return FourierActivation(W, _f64(act.exact_buffer("basis")) @ R.T, act=copy.deepcopy(act.act))


@restrictor(IrrepMlp, kind=IrrepRestriction)
def _restrict_mlp(mlp: IrrepMlp, r: IrrepRestriction) -> IrrepMlp:
    """A new MLP on H's types (its forward follows its layers), loaded with the restricted linears."""
    like = mlp.fc1.weight
    new = IrrepMlp(r.restricted_type(mlp.in_type), restrict_module(mlp.act, r)).to(like.device, like.dtype)
    new.fc1.load_state_dict(restrict_module(mlp.fc1, r).state_dict())
    new.fc2.load_state_dict(restrict_module(mlp.fc2, r).state_dict())
    return new


@restrictor(IrrepAttention, kind=IrrepRestriction)
def _restrict_attention(attn: IrrepAttention, r: IrrepRestriction) -> IrrepAttention:
    """The images of G's heads; q, k, v and the projection restricted; frame RoPE reached from the new layout.

    In the irrep basis a head's image is its support in W (whole H copies). Heads in another basis
    ``u = x T`` keep their coordinates: with ``x = y R`` they are coordinates of ``y (R T)``.
    """
    W, R = r.map(attn.in_type)
    T = attn.head_basis.exact_buffer("matrix").numpy() if isinstance(attn.head_basis, HeadBasis) else None
    if T is None:
        heads, basis, new_T = [_support(R, h) for h in attn.heads], None, np.eye(W.dim)
    else:
        heads, basis = attn.heads, R @ T
        new_T = basis
    new = IrrepAttention(
        W, heads, qkv_bias=attn.q.bias is not None, attn_drop=attn.attn_drop, fused=attn.fused, basis=basis
    ).double()
    for name in ("q", "k", "v", "proj"):
        setattr(new, name, restrict_module(getattr(attn, name), r))
    if isinstance(attn.rotary, FrameRotary):
        # old layout = y (R T)[:, perm] and y = new layout (T'[:, perm'])^T: compose with the old map to frames.
        old_T = np.eye(attn.in_type.dim) if T is None else T
        perm, new_perm = attn.perm.cpu().numpy(), new.perm.cpu().numpy()
        layout = new_T[:, new_perm].T @ (R @ old_T)[:, perm]
        rot = attn.rotary
        new.rotary = FrameRotary(
            rot.order, rot.channels, layout @ rot.exact_buffer("to_frames").numpy(), rot.rope_heads, rot.rope_head_dim
        )
    elif not isinstance(attn.rotary, type(new.rotary)):
        raise ValueError(f"no restriction is known for the rotary adapter {type(attn.rotary).__name__}")
    return new


@restrictor(FrameRoPE, kind=IrrepRestriction)
def _keep_frame_rope(rope: FrameRoPE, r: IrrepRestriction) -> FrameRoPE:
    """Frame RoPE on G's frames is G-, hence H-equivariant; the attention's adapter still reaches G's frames."""
    return copy.deepcopy(rope)


@restrictor(InvariantAPE, kind=IrrepRestriction)
def _restrict_ape(ape: InvariantAPE, r: IrrepRestriction) -> InvariantAPE:
    """The encoding ``p R^T``, re-expanded in H's (larger) invariant basis."""
    W, R = r.map(ape.embedding_type)
    new = InvariantAPE(r.H, ape.centers, W).double()
    new.load_embedding_(_f64(ape.embedding()) @ R.T)
    return new


# ------------------------------------------------------------------------------------------------
# tokenizers and the head


def _restrict_planar(tok: PlanarTokenizer, new: PlanarTokenizer, r: IrrepRestriction) -> PlanarTokenizer:
    """Load ``new`` (H's filter basis of C(U)) with ``R`` applied to ``tok``'s filters, bias and class token."""
    V = tok.out_type
    _, R = r.map(V)
    new = new.double()
    filters_g = _f64(tok.embed.proj.weight_matrix()) @ _f64(tok.embed.exact_buffer("filter_basis"))
    basis_h = _f64(new.embed.exact_buffer("filter_basis"))
    b = tok.embed.proj.bias_vector()
    new.embed.proj.load_dense_(R @ filters_g @ basis_h.T, None if b is None else R @ _f64(b))
    if tok.cls_token is not None:
        cls_v = np.zeros(V.dim)
        cls_v[V.trivial_index] = _f64(tok.cls_token)
        new.cls_token.copy_(torch.as_tensor((R @ cls_v)[new.out_type.trivial_index]))
    return new


@restrictor(PlanarTokenizer, kind=IrrepRestriction)
def _restrict_planar_tokenizer(tok: PlanarTokenizer, r: IrrepRestriction) -> PlanarTokenizer:
    index = tok.patch_index.cpu().numpy()
    W = r.restricted_type(tok.out_type)
    new = PlanarTokenizer(r.H, tok.offsets, tok.centers, index, tok.in_chans, W, tok.cls_token is not None)
    return _restrict_planar(tok, new, r)


@restrictor(SquarePatchTokenizer, kind=IrrepRestriction)
def _restrict_square_tokenizer(tok: SquarePatchTokenizer, r: IrrepRestriction) -> SquarePatchTokenizer:
    W = r.restricted_type(tok.out_type)
    new = SquarePatchTokenizer(r.H, tok.img_size, tok.patch_size, tok.in_chans, W, tok.cls_token is not None)
    return _restrict_planar(tok, new, r)


@restrictor(HexPatchTokenizer, kind=IrrepRestriction)
def _restrict_hex_tokenizer(tok: HexPatchTokenizer, r: IrrepRestriction) -> HexPatchTokenizer:
    W = r.restricted_type(tok.out_type)
    new = HexPatchTokenizer(r.H, tok.grid, tok.in_chans, W, tok.cls_token is not None)
    return _restrict_planar(tok, new, r)


@restrictor(TokenInvariants, kind=IrrepRestriction)
def _restrict_invariants(readout: TokenInvariants, r: IrrepRestriction) -> TokenInvariants:
    """The images of G's trivial coordinates and of G's irrep copies: the same invariants, in the same order
    (the classifier reading them is kept as it is)."""
    W, R = r.map(readout.in_type)
    trivial = np.array([_support(R, np.array([t]))[0] for t in readout.trivial], dtype=np.int64)
    return TokenInvariants(W, trivial=trivial, groups=[_support(R, g) for g in readout.groups])


# ------------------------------------------------------------------------------------------------
# models


@restrictor(EquivariantViT, kind=IrrepRestriction)
def _restrict_model(model: EquivariantViT, r: IrrepRestriction) -> EquivariantViT:
    """The model of the restricted components: H's token type, and as its group the input's symmetries (all of H,
    or on square images resampled onto hexagons those that map the image onto itself)."""
    group = symmetry_subgroup(r.H, model.domain.points)
    return restricted_model(
        model, r, group, r.restricted_type(model.token_type), group=r.H.name, restricted_from=r.G.name
    )


def is_irrep_model(model: nn.Module) -> bool:
    """Whether ``model``'s tokens are irrep-wise features (``o2vit_*``, or a restriction of one)."""
    ftype = getattr(model, "token_type", None)
    return isinstance(model, EquivariantViT) and isinstance(ftype, FeatureType) and ftype.basis == "irrep"


def restrict_irrep_model(model: EquivariantViT, H: FiniteGroup) -> EquivariantViT:
    """``model`` (irrep features of ``V.group``, ``V = model.token_type``) restricted to the subgroup ``H``, in
    float64 until the end."""
    V = model.token_type
    attn = model.blocks[0].attn if len(model.blocks) else None
    heads = attn.heads if isinstance(attn, IrrepAttention) and isinstance(attn.head_basis, IdentityBasis) else None
    restriction = IrrepRestriction.build(V.group, H, V, heads)
    like = next(model.parameters())
    with torch.no_grad():
        new = restrict_module(model, restriction)
    return new.to(device=like.device, dtype=like.dtype)
