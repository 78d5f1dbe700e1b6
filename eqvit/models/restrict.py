"""Restriction of an O(2)-subgroup ViT to a subgroup (O(2) seed, Theorem 2, Lemma 2, App. E).

``restrict(model, "H")`` returns an H-equivariant model of the same family that computes the same
function. Every feature space ``V = (+)_rho R^{C_rho} (x) V_rho`` of G is mapped to
``W = (+)_sigma R^{D_sigma} (x) W_sigma`` of H by an H-equivariant isometry ``Res`` built copy by
copy (each G-irrep copy restricts to a few H-irrep copies, ``Representation.from_matrices`` on
``rho(H)``), and every equivariant affine map ``f(x) = A x + b`` becomes ``Res' A Res^T y + Res' b``
(Lemma 2), projected onto the H-parametrisation of eq. 4-5 (the projection is exact; a residual is
an error). The parts that are fixed rather than learned follow App. E:

* attention heads are the images of G's heads (for coupled attention the copies of W are ordered so
  that these are exactly W's coupled heads, the ``Phi`` of Step 2);
* the MLP's G-set X is viewed as an H-set (a union of H-orbits, the ``m_beta`` of Theorem 2); its
  Fourier basis is the G one composed with ``Res'`` (an H-Fourier basis of C(X));
* the patch embedding uses H's own filter basis of C(U) (Step 1), the APE H's invariant basis;
* LayerNorm centres the image of G's trivial channels, and the head takes the norms of the images
  of G's irrep copies (these keep the function identical; with H's own groupings it would change).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from eqvit.groups import FiniteGroup, Representation
from eqvit.models.vit import EquivariantViT
from eqvit.nn.activation import FourierActivation
from eqvit.nn.irrep_blocks import InvariantHead, irrep_block
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import DropPath
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.posenc.invariant import InvariantAPE
from eqvit.nn.tokenizers.hexagonal import HexPatchTokenizer
from eqvit.nn.tokenizers.planar import PlanarTokenizer
from eqvit.nn.tokenizers.square import SquarePatchTokenizer
from eqvit.utils import unknown_name_error


def find_subgroup(group: FiniteGroup, subgroup: str | FiniteGroup | np.ndarray) -> FiniteGroup:
    """The subgroup of ``group`` called ``subgroup`` (e.g. ``"C4"``, ``"D2"``, ``"D3[30deg]"``)."""
    if isinstance(subgroup, FiniteGroup):
        if subgroup.parent is not group:
            raise ValueError(f"{subgroup!r} was not taken from {group!r} (use group.subgroup(...))")
        return subgroup
    if not isinstance(subgroup, str):
        return group.subgroup(np.asarray(subgroup, dtype=np.int64))
    if group.dim == 3:  # the Platonic frames: subgroups named by structure ("T", "D2", "C3", ...)
        from eqvit.models.restrict_platonic import find_spatial_subgroup

        return find_spatial_subgroup(group, subgroup)
    names = {}
    for idx in group.all_subgroups():
        names.setdefault(group.subgroup(idx).name, idx)
    if subgroup == group.name:
        return group.subgroup(np.arange(group.order))
    if subgroup not in names:
        raise unknown_name_error(f"subgroup of {group.name}", subgroup, list(names))
    return group.subgroup(names[subgroup])


@cache
def _restricted_irrep(rho_matrices_key: bytes, shape: tuple[int, ...], H: FiniteGroup) -> tuple[list, np.ndarray]:
    matrices = np.frombuffer(rho_matrices_key, dtype=np.float64).reshape(shape)
    if shape[1] == 1:  # a 1-d irrep restricts to one 1-d irrep with the identity as intertwiner
        rep = Representation.from_matrices(H, matrices)
        return rep.irreps, np.ones((1, 1))
    rep = Representation.from_matrices(H, matrices)
    return rep.irreps, rep.change_of_basis


def restriction_map(
    V: FeatureType, H: FiniteGroup, heads: list[np.ndarray] | None = None
) -> tuple[FeatureType, np.ndarray]:
    """``(W, R)``: the H feature type of ``V`` and the isometry ``R [W.dim, V.dim]`` (``w = R v``).

    ``R rho_V(h) = rho_W(h) R`` for h in H. The copies of each H-irrep are ordered by (head of
    their G copy, G irrep, G copy, position), so coupled heads map onto coupled heads.
    """
    G = V.group
    if H.parent is not G:
        raise ValueError(f"{H!r} is not a subgroup taken from {G!r}")
    head_of = np.zeros(V.dim, dtype=np.int64)
    for r, h in enumerate(heads or []):
        head_of[h] = r
    h_names = [s.name for s in H.irreps]
    entries = []  # (key, sigma index, v coords, Q columns)
    for i, rho, c, sl in V.blocks():
        mats = np.ascontiguousarray(rho.matrices[H.parent_indices])
        sigmas, Q = _restricted_irrep(mats.tobytes(), mats.shape, H)
        for k in range(c):
            v = np.arange(sl.start + k * rho.dim, sl.start + (k + 1) * rho.dim)
            col = 0
            for j, sigma in enumerate(sigmas):
                entries.append(((head_of[v[0]], i, k, j), h_names.index(sigma.name), v, Q[:, col : col + sigma.dim]))
                col += sigma.dim
    counts = [0] * len(h_names)
    for _, s, _, _ in entries:
        counts[s] += 1
    W = FeatureType(H, counts)
    R = np.zeros((W.dim, V.dim))
    next_copy = [0] * len(h_names)
    for _, s, v, Qj in sorted(entries, key=lambda e: e[0]):
        d = Qj.shape[1]
        start = int(W.offsets[s]) + next_copy[s] * d
        next_copy[s] += 1
        R[start : start + d, v] = Qj.T
    return W, R


def _support(R: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """W coordinates that the V coordinates ``coords`` map to."""
    return np.flatnonzero(np.abs(R[:, coords]).max(axis=1) > 1e-12)


def _f64(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to("cpu", torch.float64).numpy()


def _affine(layer: IrrepLinear) -> tuple[np.ndarray, np.ndarray]:
    b = layer.bias_vector()
    b = np.zeros(layer.out_type.dim) if b is None else _f64(b)
    return _f64(layer.weight_matrix()), b


def _restrict_linear(
    layer: IrrepLinear, R_in: np.ndarray, W_in: FeatureType, R_out: np.ndarray, W_out: FeatureType
) -> IrrepLinear:
    A, b = _affine(layer)
    new = IrrepLinear(W_in, W_out, bias=layer.bias is not None).double()
    new.load_dense_(R_out @ A @ R_in.T, R_out @ b)
    return new


def _restrict_norm(norm: IrrepLayerNorm, V: FeatureType, W: FeatureType, R: np.ndarray) -> IrrepLayerNorm:
    center = np.flatnonzero(_f64(norm._exact_masters["center_weights"]) > 0)
    new = IrrepLayerNorm(W, eps=norm.eps, center=_support(R, center)).double()
    gamma_v = _f64(norm.weight)[V.copy_index]  # per coordinate
    gamma_w = gamma_v[np.abs(R).argmax(axis=1)]  # each W coordinate comes from one G copy
    beta_v = np.zeros(V.dim)
    beta_v[norm.bias_index.cpu().numpy()] = _f64(norm.bias)
    beta_w = R @ beta_v
    with torch.no_grad():
        new.weight.copy_(torch.as_tensor(gamma_w[[idx[0] for _, _, idx in W.copies]]))
        new.bias.copy_(torch.as_tensor(beta_w[W.trivial_index]))
    rest = beta_w.copy()
    rest[W.trivial_index] = 0
    if np.abs(rest).max(initial=0) > 1e-9:
        raise ValueError("LayerNorm bias does not restrict into the trivial irreps")
    return new


def _check_o2_layout(model: EquivariantViT) -> None:
    """ValueError unless the O(2) model has the layouts restriction covers (invariant APE; coupled or
    irrep-wise heads in the irrep basis, no rotary scheme)."""
    from eqvit.nn.basis import IdentityBasis, NoRotary

    ok = isinstance(model.posenc, InvariantAPE) and all(
        isinstance(getattr(blk.attn, "head_basis", None), IdentityBasis)
        and isinstance(getattr(blk.attn, "rotary", None), NoRotary)
        for blk in model.blocks
    )
    if not ok:
        config = model.config
        raise ValueError(
            "restrict() covers O(2) ViTs with posenc='invariant_ape' and attention 'coupled' or 'irrepwise', "
            f"got posenc={config.get('posenc', 'invariant_ape')!r}, attention={config.get('attention')!r}"
        )


def restrict(model: EquivariantViT, subgroup: str | FiniteGroup) -> EquivariantViT:
    """An H-equivariant model computing the same function as the G-equivariant ``model`` (Theorem 2).

    Args:
        model: an O(2)-subgroup ViT (``eqvit.create_model("o2vit_*")``), a Platonic Transformer
            (``platonic_*``, restricted frame by frame: :mod:`eqvit.models.restrict_platonic`) or a
            restricted one.
        subgroup: a subgroup name of ``model.group`` (``"C4"``, ``"D2"``, ``"D1"``, ...; for Platonic
            models of ``model.frames``, e.g. ``"T"``), or a FiniteGroup taken from it with
            ``model.group.subgroup(indices)``.

    Returns:
        A new model (same dtype, eval/train mode copied) with ``.group`` the subgroup.
    """
    from eqvit.models.restrict_platonic import is_platonic, restrict_platonic

    if is_platonic(model):
        return restrict_platonic(model, subgroup)
    if not isinstance(getattr(model, "tokenizer", None), PlanarTokenizer):
        raise ValueError("restrict() expects an O(2)-subgroup ViT (o2vit_*) or a Platonic Transformer (platonic_*)")
    _check_o2_layout(model)
    G = model.group
    H = find_subgroup(G, subgroup)
    dtype = next(model.parameters()).dtype
    V = model.feature_type
    first_heads = model.blocks[0].attn.heads
    if any(
        len(a) != len(b) or any(not np.array_equal(x, y) for x, y in zip(a, b))
        for a, b in ((blk.attn.heads, first_heads) for blk in model.blocks)
    ):
        raise ValueError("restrict() expects the same head layout in every block")
    W, R = restriction_map(V, H, first_heads)

    with torch.no_grad():
        # Step 1: patch embedding (H's own filter basis of C(U)) and the class token.
        tok = model.tokenizer
        has_cls = tok.cls_token is not None
        if isinstance(tok, SquarePatchTokenizer):
            new_tok = SquarePatchTokenizer(H, tok.img_size, tok.patch_size, tok.in_chans, W, has_cls)
        elif isinstance(tok, HexPatchTokenizer):
            new_tok = HexPatchTokenizer(H, tok.grid, tok.in_chans, W, has_cls)
        else:
            index = tok.patch_index.cpu().numpy()
            new_tok = PlanarTokenizer(H, tok.offsets, tok.centers, index, tok.in_chans, W, has_cls)
        new_tok = new_tok.double()
        filters_g = _f64(tok.embed.proj.weight_matrix()) @ _f64(tok.embed._exact_masters["filter_basis"])
        basis_h = _f64(new_tok.embed._exact_masters["filter_basis"])
        b = tok.embed.proj.bias_vector()
        new_tok.embed.proj.load_dense_(R @ filters_g @ basis_h.T, None if b is None else R @ _f64(b))
        if tok.cls_token is not None:
            cls_v = np.zeros(V.dim)
            cls_v[V.trivial_index] = _f64(tok.cls_token)
            cls_w = R @ cls_v
            new_tok.cls_token.copy_(torch.as_tensor(cls_w[W.trivial_index]))

        # Step 1: invariant APE, re-expanded in H's invariant basis.
        ape = model.posenc
        new_ape = InvariantAPE(H, tok.centers, W).double()
        p_w = _f64(ape.embedding()) @ R.T  # [M, W.dim]
        recon = np.zeros_like(p_w)
        blocks_w = W.blocks()
        for n, k, _ in new_ape._used:
            _, sigma, c, sl = blocks_w[n]
            B = _f64(new_ape._exact_masters[f"basis_{n}"])  # [k, M, d]
            coeff = np.einsum("mcd,kmd->ck", p_w[:, sl].reshape(len(p_w), c, sigma.dim), B)
            new_ape.pos_embed[k].copy_(torch.as_tensor(coeff))
            recon[:, sl] = np.einsum("ck,kmd->mcd", coeff, B).reshape(len(p_w), -1)
        if np.abs(recon - p_w).max(initial=0) > 1e-9 * max(1.0, np.abs(p_w).max(initial=0)):
            raise ValueError("positional encoding is not H-invariant after restriction")

        # Steps 2-4: blocks.
        new_blocks = []
        for blk in model.blocks:
            act = blk.mlp.act
            Vh = act.ftype
            Wh, Rh = restriction_map(Vh, H)
            new_act = FourierActivation(Wh, _f64(act._exact_masters["basis"]) @ Rh.T, act=blk.mlp.act.act)
            heads = [_support(R, h) for h in blk.attn.heads]
            rate = blk.drop_path1.p if isinstance(blk.drop_path1, DropPath) else 0.0
            new = irrep_block(
                W, heads, new_act, rate, blk.attn.attn_drop, blk.attn.q.bias is not None, blk.attn.fused
            ).double()
            new.norm1 = _restrict_norm(blk.norm1, V, W, R)
            new.norm2 = _restrict_norm(blk.norm2, V, W, R)
            for name in ("q", "k", "v", "proj"):
                setattr(new.attn, name, _restrict_linear(getattr(blk.attn, name), R, W, R, W))
            new.mlp.fc1 = _restrict_linear(blk.mlp.fc1, R, W, Rh, Wh)
            new.mlp.fc2 = _restrict_linear(blk.mlp.fc2, Rh, Wh, R, W)
            new_blocks.append(new)

        # Final norm and the head: the images of G's trivial channels and of G's irrep copies.
        head = model.head
        trivial_w = np.array([_support(R, np.array([t]))[0] for t in head.trivial], dtype=np.int64)
        new_head = InvariantHead(
            W, head.fc.out_features, head.drop.p, trivial=trivial_w, groups=[_support(R, g) for g in head.groups]
        )
        new_model = EquivariantViT(
            tokenizer=new_tok,
            head=new_head,
            embed_dim=W.dim,
            depth=len(new_blocks),
            num_heads=len(new_blocks[0].attn.heads) if new_blocks else 0,
            drop_rate=model.pos_drop.p,
            posenc=new_ape,
            group=H,
            domain=model.domain,
            in_chans=model.in_chans,
            out_chans=model.out_chans,
            output_action=model.output_action,
            block_fn=lambda i, rate: new_blocks[i],
            norm_layer=_restrict_norm(model.norm, V, W, R),
            num_prefix_tokens=model.num_prefix_tokens,
            config=dict(model.config, group=H.name, restricted_from=G.name),
            token_grid=model.token_grid,
            token_type=W,
            feature_reduction=getattr(model, "feature_info", [{"reduction": 1}])[0]["reduction"],
        ).double()
        # EquivariantViT re-initialises nn.Linear layers: set the classifier afterwards.
        new_model.head.fc.weight.copy_(head.fc.weight.double())
        new_model.head.fc.bias.copy_(head.fc.bias.double())
    new_model.feature_type = W
    new_model.default_cfg = new_model.pretrained_cfg = dict(getattr(model, "default_cfg", {}))
    new_model.train(model.training)
    return new_model.to(dtype)


class SymmetryRelaxation:
    """Gradual symmetry breaking (the seed's remark after Theorem 2): G-equivariant early, a subgroup later.

    For O(2)-subgroup ViTs and Platonic Transformers alike (both through :func:`restrict`).

    Args:
        schedule: ``{epoch: subgroup name}``; at the start of that epoch the model is replaced by its
            :func:`restrict`-ion (same function, more freedom), e.g. ``{10: "D2", 20: "C1"}``.

    ``model, changed = relaxation.step(model, epoch)``; when ``changed`` the caller rebuilds its
    optimizer (the parameters are new tensors; optimizer state restarts).
    """

    def __init__(self, schedule: dict[int, str]) -> None:
        if any(int(e) < 0 for e in schedule):
            raise ValueError(f"relaxation epochs must be non-negative, got {sorted(schedule)}")
        self.schedule = {int(e): s for e, s in sorted(schedule.items())}

    def step(self, model: EquivariantViT, epoch: int) -> tuple[EquivariantViT, bool]:
        target = self.schedule.get(int(epoch))
        if target is None or target == getattr(model, "frames", model.group).name:  # Platonic: the frames
            return model, False
        return restrict(model, target), True
