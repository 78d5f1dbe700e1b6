"""Transformer block, MLP and invariant classification head on irrep-wise features (O(2) seed, Sec. 4)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eqvit.nn.activation import FourierActivation
from eqvit.nn.init import vit_linear
from eqvit.nn.irrep_attention import IrrepAttention
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.layers import Block, check_num_classes
from eqvit.nn.linear import IrrepLinear
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.rows_mlp import activation_kind, rows_mlp, rows_mlp_applies, rows_mlp_lean


class IrrepMlp(nn.Module):
    """``l2 o FT sigma FT^-1 o l1`` with hidden features ``C(X, R)`` (Sec. 4.3.2).

    Three forwards, chosen at construction. With ``components``-layout types (Schur linears) and a strided
    Fourier nonlinearity (copies of one homogeneous space) the hidden features are coefficient rows
    (:func:`rows_mlp`; :func:`rows_mlp_lean` when ``sigma`` is one whose derivative it knows, keeping half the
    hidden activations for backward); with other Schur layouts it is ``fc2(act(fc1(x)))``, the transforms one small
    ``[|X_s|, |X_s|]`` matmul per token and orbit around the GELU (:class:`FourierActivation`).
    Otherwise it folds the Fourier transforms into the linear maps (:meth:`FourierActivation.fold_into_linears`):
    ``W1' = FT^-1 W1``, ``W2' = W2 FT``, exactly a dense MLP of hidden width |X| with the pointwise
    ``sigma`` (the shape of a timm ``Mlp``); the folded weights are recomputed on every call
    (:meth:`fold` fixes them for inference).
    """

    def __init__(self, ftype: FeatureType, activation: FourierActivation) -> None:
        super().__init__()
        self.in_type = self.out_type = ftype
        self.fc1 = IrrepLinear(ftype, activation.in_type)
        self.act = activation
        self.fc2 = IrrepLinear(activation.in_type, ftype)
        # The forward for these layers: for Schur linears the row form when the activation is strided
        # (:func:`rows_mlp`), else the plain chain; otherwise the folded dense MLP.
        self.schur = self.fc1.schur and self.fc2.schur
        rows = self.schur and rows_mlp_applies(self.fc1, activation, self.fc2)
        lean = rows and activation_kind(activation.act) is not None  # sigma' known: one hidden tensor saved
        self._impl = ((_lean_rows_mlp if lean else _rows_mlp) if rows else _schur_mlp) if self.schur else _folded_mlp

    def folded_weights(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """``(W1' [|X|, dim], b1', W2' [dim, |X|], b2)`` of the dense MLP on values over X."""
        (w1, b1), (w2, b2) = self._modules["fc1"].dense(), self._modules["fc2"].dense()
        return (*self.act.fold_into_linears(w1, b1, w2), b2)

    def forward_with(
        self, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None
    ) -> torch.Tensor:
        """``x [..., dim] -> [..., dim]`` with given folded weights (:meth:`folded_weights`)."""
        return F.linear(self.act.act(F.linear(x, w1, b1)), w2, b2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., dim] -> [..., dim]``."""
        return self._impl(self, x)

    def fold(self) -> nn.Module:
        """The inference form: the folded dense MLP fixed; with Schur linears the layer itself, its linears
        folding themselves."""
        if self.schur:
            return self
        from eqvit.nn.folded import FoldedMlp

        w1, b1, w2, b2 = self.folded_weights()
        return FoldedMlp(w1, b1, self.act.act, w2, b2, in_type=self.in_type)

    def fold_in_stream(self, basis, norm_output) -> nn.Module | None:
        """The inference form in a model whose stream is kept in ``basis`` (:mod:`eqvit.nn.stream`): ``fc1`` reads
        the folded norm's output (``norm_output``), ``fc2`` writes the stream; None with Schur linears (a dense
        change of basis would undo their blocks)."""
        if self.schur:
            return None
        from eqvit.nn.folded import FoldedMlp

        w1, b1, w2, b2 = self.folded_weights()
        # in_type None: tokens in the stream basis, which no FeatureType describes
        return FoldedMlp(*norm_output.reading(w1, b1), self.act.act, *basis.writing(w2, b2))

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """``fc2(FT sigma FT^-1 fc1(x))`` with the dense Fourier basis (eq. 10)."""
        return self.fc2(self.act.forward_dense(self.fc1(x)))


def _folded_mlp(m: IrrepMlp, x: torch.Tensor) -> torch.Tensor:
    return m.forward_with(x, *m.folded_weights())


def _schur_mlp(m: IrrepMlp, x: torch.Tensor) -> torch.Tensor:
    return m.fc2(m.act(m.fc1(x)))


def _rows_mlp(m: IrrepMlp, x: torch.Tensor) -> torch.Tensor:
    return rows_mlp(m.fc1, m.act, m.fc2, x)


def _lean_rows_mlp(m: IrrepMlp, x: torch.Tensor) -> torch.Tensor:
    return rows_mlp_lean(m.fc1, m.act, m.fc2, x)


def irrep_block(
    ftype: FeatureType,
    heads: Sequence[np.ndarray],
    activation: FourierActivation,
    drop_path: float = 0.0,
    attn_drop: float = 0.0,
    qkv_bias: bool = True,
    fused: bool = True,
    norm_centers: tuple[np.ndarray | None, np.ndarray | None] = (None, None),
    basis: np.ndarray | None = None,
    frame_rope: tuple[int, int] | None = None,
) -> Block:
    """The O(2) seed's block on irrep-wise tokens ``[B, N, ftype.dim]``: equivariant LayerNorms,
    irrep-wise attention, the Fourier-nonlinearity MLP (every part G-equivariant).

    Args:
        ftype: token feature type V.
        heads: attention head layout (coordinate index arrays).
        activation: the MLP's Fourier nonlinearity (fixes the hidden type).
        drop_path, attn_drop: regularisation.
        fused: SDPA or the reference attention path.
        norm_centers: optional ``(norm1, norm2)`` centring coordinates (restricted models).
        basis, frame_rope: the attention's head basis and frame RoPE split (:class:`IrrepAttention`).
    """
    return Block(
        IrrepLayerNorm(ftype, center=norm_centers[0]),
        IrrepAttention(
            ftype, heads, qkv_bias=qkv_bias, attn_drop=attn_drop, fused=fused, basis=basis, frame_rope=frame_rope
        ),
        IrrepLayerNorm(ftype, center=norm_centers[1]),
        IrrepMlp(ftype, activation),
        drop_path=drop_path,
    )


class TokenInvariants(nn.Module):
    """The invariants of every token (Sec. 4.5, eq. 15): ``[..., dim] -> [..., num_features]``.

    ``x -> x_trivial (+) (|x_{rho, c}|)_{rho != trivial, c}``: the trivial coordinates, then the Euclidean
    norm of every non-trivial irrep copy (invariant: the irrep matrices are orthogonal). A restricted model
    passes its parent's grouping: ``trivial`` coordinates and ``groups`` (coordinate sets whose norms are
    taken). The O(2) models' ``forward_features`` returns these for every token; the class token's are what
    the classifier reads (:class:`ClassTokenHead`).

    Args:
        ftype: the tokens' feature type V.
        trivial, groups: the grouping (default: V's trivial coordinates and its non-trivial irrep copies).
    """

    def __init__(
        self, ftype: FeatureType, trivial: np.ndarray | None = None, groups: Sequence[np.ndarray] | None = None
    ) -> None:
        super().__init__()
        self.in_type = ftype
        if trivial is None:
            trivial = ftype.trivial_index
        if groups is None:
            groups = [idx for i, _, idx in ftype.copies if not ftype.irreps[i].is_trivial]
        self.trivial = np.asarray(trivial, dtype=np.int64)
        self.groups = [np.asarray(g, dtype=np.int64) for g in groups]
        self.register_buffer("trivial_index", torch.from_numpy(self.trivial.copy()), persistent=False)
        # Every group's sum of squares in one GEMM against its 0/1 membership column [dim, groups]: a gather
        # into groups and a norm over their few coordinates each are several times slower on a CPU.
        membership = np.zeros((ftype.dim, len(self.groups)))
        for k, g in enumerate(self.groups):
            membership[g, k] = 1.0
        self.register_buffer("membership", torch.from_numpy(membership).to(torch.get_default_dtype()), persistent=False)
        self.num_features = len(self.trivial) + len(self.groups)
        self._impl = _trivial_and_norms if self.groups else _trivial_only

    def extra_repr(self) -> str:
        return f"{self.in_type} -> {self.num_features} invariants"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., dim] -> [..., num_features]``: the trivial coordinates, then one norm per group."""
        return self._impl(self, x)

    def fold_in_stream(self, basis: nn.Module) -> nn.Module:
        """The inference form reading tokens kept in ``basis`` (:class:`~eqvit.nn.stream.StreamBasis`): the map
        back to the coordinates it reads folded into one linear map
        (:class:`~eqvit.nn.folded.FoldedTokenInvariants`)."""
        from eqvit.nn.folded import FoldedTokenInvariants

        return FoldedTokenInvariants(self, basis)


def _trivial_only(m: TokenInvariants, x: torch.Tensor) -> torch.Tensor:
    return x.index_select(-1, m.trivial_index)


def _trivial_and_norms(m: TokenInvariants, x: torch.Tensor) -> torch.Tensor:
    squares = (x * x) @ m.membership.to(x.dtype)  # a 0/1 matrix: exact in any dtype the tokens come in
    # clamped at the smallest normal number: a zero copy gets gradient 0 (as vector_norm's), not 0 * inf
    norms = squares.clamp_min(torch.finfo(squares.dtype).tiny).sqrt()
    return torch.cat([x.index_select(-1, m.trivial_index), norms], dim=-1)


class ClassTokenHead(nn.Module):
    """Classifier on the class token's invariant features: ``[B, N, num_features] -> logits [B, num_classes]``.

    The timm classifier interface: :meth:`pre_logits` gives the class token's features ``[B, num_features]``
    (after the dropout), ``fc`` is the classifier and :meth:`reset_classifier` replaces it; ``num_classes = 0``
    makes ``fc`` the identity, so the head returns the features.

    Args:
        num_features: width of the features (:attr:`TokenInvariants.num_features`).
        num_classes: logits (0: no classifier).
        drop: dropout before the classifier.
    """

    def __init__(self, num_features: int, num_classes: int, drop: float = 0.0) -> None:
        super().__init__()
        self.num_features = num_features
        self.drop = nn.Dropout(drop)
        # Follows the model's device and dtype, so that a classifier made by reset_classifier after
        # reset_classifier(0) (no parameter left here) is placed as the rest of the model.
        self.register_buffer("placement", torch.empty(0), persistent=False)
        self.reset_classifier(num_classes)

    def reset_classifier(self, num_classes: int) -> None:
        """A fresh classifier ``fc`` of ``num_classes`` logits; 0 makes it the identity."""
        self.num_classes = check_num_classes(num_classes)
        like = self.placement
        self.fc = (
            vit_linear(self.num_features, num_classes, device=like.device, dtype=like.dtype)
            if num_classes
            else nn.Identity()
        )

    def select_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, N, C] -> [B, 1, C]``: the tokens whose features the head reads, the class token (the model's
        ``forward`` normalises and reads out only these)."""
        return tokens[:, :1]

    def pre_logits(self, features: torch.Tensor) -> torch.Tensor:
        """``features [B, N, num_features] -> [B, num_features]``: the class token's, after the dropout."""
        return self.drop(features[:, 0])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``features [B, N, num_features] -> logits [B, num_classes]`` (the features when ``num_classes`` is 0)."""
        return self.fc(self.pre_logits(features))
