"""The common ViT: tokenizer -> positional scheme -> blocks -> norm -> head.

Every model family builds this class with its own tokenizer, positional scheme and head; the
family modules only register configurations.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from eqvit.geometry.domain import TokenMap
from eqvit.groups import FiniteGroup
from eqvit.groups.base import match_matrices
from eqvit.nn.layers import InputCheck
from eqvit.nn.posenc.base import NoPositionalEncoding, PositionalScheme
from eqvit.nn.stream import FromStream


def _as_inputs(encoded: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """An input encoding's result as the tuple of model inputs (one tensor, or ``(pos, feat)``)."""
    return encoded if isinstance(encoded, tuple) else (encoded,)


def _output(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return out


def _output_plus_input(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return out + x


def _all_tokens(tokens: torch.Tensor) -> torch.Tensor:
    return tokens


def build_blocks(block_fn: Callable[[int, float], nn.Module], depth: int, drop_path_rate: float = 0.0) -> nn.ModuleList:
    """``depth`` blocks ``block_fn(index, drop_path)`` with stochastic depth rising linearly to ``drop_path_rate``."""
    # Plain floats (not torch.linspace): models are also built under a meta-device context.
    rates = np.linspace(0.0, drop_path_rate, depth).tolist()
    return nn.ModuleList(block_fn(i, rate) for i, rate in enumerate(rates))


def _call_block(block: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    return block(*args, **kwargs)


def _checkpoint_block(block: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The block under :func:`torch.utils.checkpoint.checkpoint`: activations recomputed in backward."""
    return checkpoint(block, *args, use_reentrant=False, **kwargs)


def take_indices(num_blocks: int, indices: int | Sequence[int] | None) -> tuple[list[int], int]:
    """timm's ``feature_take_indices``: ``None`` all blocks, an int the last n, a sequence those (negative
    from the end). Returns ``(absolute indices, the largest)``; a ValueError names an index out of range."""
    if indices is None:
        indices = num_blocks
    if isinstance(indices, (int, np.integer)):
        indices = int(indices)
        if not 0 < indices <= num_blocks:
            raise ValueError(f"expected the number of last blocks in 1..{num_blocks}, got {indices}")
        taken = list(range(num_blocks - indices, num_blocks))
    else:
        taken = []
        for i in indices:
            index = num_blocks + i if i < 0 else i
            if not 0 <= index < num_blocks:
                raise ValueError(f"expected block indices in {-num_blocks}..{num_blocks - 1}, got {i}")
            taken.append(index)
        if not taken:
            raise ValueError("expected at least one block index, got none")
    return taken, max(taken)


class EquivariantViT(nn.Module):
    """A timm-style ViT whose parts decide which group it is equivariant to.

    One forward for every family: ``model(x)`` for images and the sphere (``[B, C, *grid]``);
    :class:`PointCloudViT` takes ``model(pos, feat)``. ``input_encoding`` maps the inputs (latitude
    encoding, resampling onto a hexagonal grid, centring of the positions), the tokenizer takes them
    all, and the positional scheme gives the rotary embedding for them (``posenc.rope_for(*inputs)``:
    fixed for a grid, bound to the positions of each batch for point clouds).

    Built from its components; the family builders (``eqvit.models.*``) make them.

    Args:
        tokenizer: ``(*inputs) -> tokens [B, N, embed_dim]``; its ``num_prefix_tokens`` (class tokens, default
            0) are skipped by positional schemes.
        blocks: the transformer blocks, called as ``block(tokens, rope, num_prefix_tokens)`` (:func:`build_blocks`
            makes them from a factory).
        norm: the final norm on ``[B, N, embed_dim]``.
        head: ``features [B, N, num_features] -> output``; a classifier (one with ``pre_logits``,
            ``num_features``, ``num_classes`` and ``reset_classifier``) gives invariant outputs, any other head a
            field on the input's domain.
        embed_dim: the token width.
        posenc: positional scheme; rotary schemes go into attention, others add to the tokens.
        readout: ``tokens [B, N, embed_dim] -> features [B, N, num_features]``, what the head pools (the O(2)
            models' invariants of every token); default the identity.
        input_encoding: applied to the raw inputs before tokenization (latitude encoding, resampling onto a
            hexagonal grid, centring point positions); it returns the inputs (a tensor or a tuple).
        domain: the input domain (``.points``, ``.shape``, ``.act``, ``.check``).
        group: the group the model is exactly equivariant to (for ``assert_equivariant``).
        token_type: the tokens' feature type (``.act(g, x [..., C])``), the action on the map channels.
        token_grid: the patch tokens laid out as a map (:class:`~eqvit.geometry.domain.TokenMap`): image models
            get intermediate maps (:meth:`forward_intermediates`, ``feature_info``, ``features_only``).
        to_token_type: the residual stream in ``token_type`` where the model keeps it in another basis (the
            Platonic models' Fourier coefficients, mapped to the frames): intermediate maps come out in
            ``token_type``; default the identity.
        in_chans, out_chans: channel counts (the input is checked against ``in_chans``).
        residual: predict ``x + model(x)`` (needs in_chans == out_chans and a dense head).
        drop_rate: dropout on the embedded tokens.
        config: the keyword arguments the model was built with (saved in checkpoints).

    timm's model interface: ``forward_features`` / ``forward_head(pre_logits=...)``, with a classifier
    head (one with ``pre_logits``) ``num_classes``, ``head_hidden_size``, ``get_classifier`` and
    ``reset_classifier``; ``forward_intermediates`` / ``prune_intermediate_layers`` on models with a
    ``token_grid``; ``set_grad_checkpointing`` and ``group_matcher`` (layer-wise learning-rate decay).
    """

    def __init__(
        self,
        *,
        tokenizer: nn.Module,
        blocks: Iterable[nn.Module],
        norm: nn.Module,
        head: nn.Module,
        embed_dim: int,
        posenc: PositionalScheme | None = None,
        readout: nn.Module | None = None,
        input_encoding: nn.Module | None = None,
        domain: Any = None,
        group: FiniteGroup | None = None,
        token_type: Any = None,
        token_grid: TokenMap | None = None,
        to_token_type: nn.Module | None = None,
        in_chans: int = 3,
        out_chans: int = 3,
        residual: bool = False,
        drop_rate: float = 0.0,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if residual and in_chans != out_chans:
            raise ValueError(f"residual prediction needs in_chans == out_chans, got {in_chans} and {out_chans}")
        self.in_chans, self.out_chans = in_chans, out_chans
        self.embed_dim = embed_dim
        self.readout = readout if readout is not None else nn.Identity()
        # timm: the width of forward_features' tokens, which the head pools.
        self.num_features = getattr(readout, "num_features", embed_dim)
        self.group = group
        self.domain = domain
        self.output_action = "invariant" if hasattr(head, "pre_logits") else "same"
        self.residual = residual
        self.input_check = InputCheck(domain, in_chans) if domain is not None else nn.Identity()
        self.add_input = _output_plus_input if residual else _output  # chosen here: no flag in forward
        self.config = dict(config or {})
        self.input_encoding = input_encoding if input_encoding is not None else nn.Identity()
        self.tokenizer = tokenizer
        self.posenc = posenc if posenc is not None else NoPositionalEncoding()
        self.pos_drop = nn.Dropout(drop_rate)
        self.num_prefix_tokens = getattr(tokenizer, "num_prefix_tokens", 0)
        self.blocks = blocks if isinstance(blocks, nn.ModuleList) else nn.ModuleList(blocks)
        self.norm = norm
        self.head = head
        self.token_grid, self.token_type = token_grid, token_type
        self.to_token_type = to_token_type if to_token_type is not None else nn.Identity()
        if token_grid is not None:
            self.feature_info = [
                dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=token_grid.reduction)
                for i in range(len(self.blocks))
            ]
        self.grad_checkpointing = False
        self._block_runner = _call_block  # set_grad_checkpointing swaps it: no flag in forward

    @property
    def frames(self) -> FiniteGroup:
        """The frames of a model whose tokens are functions on them (a frames-basis ``token_type``: the Platonic
        models)."""
        if getattr(self.token_type, "basis", None) != "frames":
            raise AttributeError(f"{type(self).__name__} has no frames: its tokens are {self.token_type}")
        return self.token_type.group

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {name for name, _ in self.named_parameters() if "pos_embed" in name}

    # ---------------------------------------------------------------- timm: classifier
    def _classifier(self) -> nn.Module:
        """The head if it is a classifier (has ``pre_logits``), else a ValueError."""
        head = self.head
        if not hasattr(head, "pre_logits"):
            raise ValueError(
                f"expected a classifier head (with pooled invariant features), got the dense head "
                f"{type(head).__name__}: this model has no classifier"
            )
        return head

    @property
    def num_classes(self) -> int:
        """Logits of the classifier (0 after ``reset_classifier(0)``); absent on dense models."""
        if not hasattr(self.head, "pre_logits"):
            raise AttributeError(f"{type(self).__name__} with a dense head has no num_classes")
        return self.head.num_classes

    @property
    def head_hidden_size(self) -> int:
        """Width of the pooled invariant features the classifier reads (``forward_head(pre_logits=True)``)."""
        if not hasattr(self.head, "pre_logits"):
            raise AttributeError(f"{type(self).__name__} with a dense head has no head_hidden_size")
        return self.head.num_features

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        """The final linear classifier (``nn.Identity`` after ``reset_classifier(0)``)."""
        return self._classifier().fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh classifier of ``num_classes`` logits; 0 makes :meth:`forward` return the pooled invariant
        features ``[B, head_hidden_size]``. The invariant pooling is fixed, so ``global_pool`` must be None."""
        if global_pool is not None:
            raise ValueError(f"expected global_pool=None (the invariant pooling is fixed), got {global_pool!r}")
        head = self._classifier()
        head.reset_classifier(num_classes)
        head.train(self.training)
        self.out_chans = num_classes or head.num_features
        self.config["num_classes"] = num_classes

    # ---------------------------------------------------------------- timm: training helpers
    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in backward (:func:`torch.utils.checkpoint.checkpoint`):
        the same outputs and gradients for less memory."""
        self.grad_checkpointing = bool(enable)
        self._block_runner = _checkpoint_block if enable else _call_block

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups for timm's layer-wise decay: the embedding, one group per block, the final
        norm last (the head is unmatched, so timm puts it after everything)."""
        return dict(
            stem=r"^(?:input_encoding|tokenizer|posenc)\.",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm\.", (99999,))],
        )

    # ---------------------------------------------------------------- forward

    def embed_tokens(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Encoded inputs -> tokens ``[B, N, embed_dim]`` with the additive positional encoding, before the blocks."""
        tokens = self.tokenizer(*inputs)
        p = self.num_prefix_tokens
        tokens = (
            torch.cat([tokens[:, :p], self.posenc.add_to_tokens(tokens[:, p:])], dim=1)
            if p
            else self.posenc.add_to_tokens(tokens)
        )
        return self.pos_drop(tokens)

    def run_block(self, block: nn.Module, tokens: torch.Tensor, rope: PositionalScheme | None) -> torch.Tensor:
        """One block on the tokens ``[B, N, embed_dim]`` (checkpointed when enabled)."""
        return self._block_runner(block, tokens, rope, self.num_prefix_tokens)

    def forward_blocks(self, *inputs: torch.Tensor, last: int | None = None) -> Iterator[torch.Tensor]:
        """The tokens after each block ``[B, N, embed_dim]`` (up to block ``last``), from the raw inputs."""
        inputs = _as_inputs(self.input_encoding(*inputs))
        tokens, rope = self.embed_tokens(*inputs), self.posenc.rope_for(*inputs)
        for block in self.blocks if last is None else self.blocks[: last + 1]:
            tokens = self.run_block(block, tokens, rope)
            yield tokens

    def features(
        self, *inputs: torch.Tensor, select: Callable[[torch.Tensor], torch.Tensor] = _all_tokens
    ) -> torch.Tensor:
        """Raw inputs -> the features the head pools ``[B, N, num_features]``: the readout of the normalised tokens
        (of the tokens ``select`` keeps: the final norm and the readout act token by token)."""
        # Only the last block's tokens stay referenced (``*_, tokens = ...`` would keep every block's
        # output alive to the end: fresh memory for each block instead of reusing the one before).
        (tokens,) = deque(self.forward_blocks(*inputs), maxlen=1)
        return self.readout(self.norm(select(tokens)))

    @property
    def _head_tokens(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The tokens the head reads (a head's ``select_tokens``, e.g. the class token), else all:
        :meth:`forward` normalises and reads out only those."""
        return getattr(self.head, "select_tokens", _all_tokens)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, C, *grid]`` -> the features the head pools ``[B, N, num_features]`` (the normalised tokens,
        or for the O(2) models the invariants of every normalised token)."""
        return self.features(self.input_check(x))

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Features ``[B, N, num_features]`` -> the head's output; with ``pre_logits`` the pooled invariant
        features ``[B, head_hidden_size]`` the classifier reads (classifiers only)."""
        return self._classifier().pre_logits(features) if pre_logits else self.head(features)

    # ---------------------------------------------------------------- timm: intermediates
    def _grid(self) -> TokenMap:
        if self.token_grid is None:
            raise ValueError(
                f"intermediate maps need patch tokens on an image grid (o2vit_*, platonic_image_*); "
                f"this {type(self).__name__} reads {getattr(self.domain, 'name', 'its input')}"
            )
        return self.token_grid

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's ``forward_intermediates``: the outputs of the blocks ``indices`` as maps on the patch grid.

        Args:
            x: the model's input (``[B, C, H, W]``, or ``[B, C, P]`` on the hexagonal grid).
            indices: None (every block), an int (the last n) or block indices (negative from the end).
            return_prefix_tokens: pair each map with the class token(s) ``[B, num_prefix_tokens, C]`` (in
                :attr:`token_type`, as the maps).
            norm: apply the final norm to each intermediate.
            stop_early: run only the blocks up to the last one taken.
            output_fmt: ``"NCHW"``: ``[B, C, *token_grid.shape]``, channels first with the patch tokens laid
                out by :attr:`token_grid` (:class:`~eqvit.geometry.domain.TokenMap`): ``[B, C, H', W']`` on
                square images (``H' = H / patch``, rows top down, like timm); on the hexagonal grid the patch
                centres in axial coordinates, ``[B, C, 2r + 1, 2r + 1]`` with the cells outside the hexagon
                zero; ``"NLC"``: ``[B, M, C]``, the M patch tokens in the tokenizer's order.
            intermediates_only: return only the maps.

        The maps are block outputs in the tokens' feature type (:attr:`token_type`: irrep-wise for the
        O(2) models, regular ``|G| x C`` frames-major for the Platonic ones), equivariant under
        :meth:`intermediate_action`.

        Returns:
            The maps, or ``(forward_features(x), maps)``.
        """
        grid = self._grid()
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"expected output_fmt 'NCHW' or 'NLC', got {output_fmt!r}")
        taken, last = take_indices(len(self.blocks), indices)
        intermediates = []
        for i, tokens in enumerate(self.forward_blocks(self.input_check(x), last=last if stop_early else None)):
            if i in taken:
                intermediates.append(self.norm(tokens) if norm else tokens)
        p = self.num_prefix_tokens
        maps = [self.to_token_type(y[:, p:]) for y in intermediates]
        if output_fmt == "NCHW":
            maps = [grid.to_map(y.transpose(1, 2)) for y in maps]
        if return_prefix_tokens:
            maps = [(m, self.to_token_type(y[:, :p])) for m, y in zip(maps, intermediates)]
        if intermediates_only:
            return maps
        return self.readout(self.norm(tokens)), maps

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last of ``indices``, and the final norm / the head if asked.

        Returns the absolute indices kept (for :meth:`forward_intermediates`).
        """
        self._grid()
        taken, last = take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: last + 1]
        self.feature_info = self.feature_info[: last + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.head = nn.Identity()
        return taken

    def intermediate_action(self, matrix: np.ndarray, fmap: torch.Tensor) -> torch.Tensor:
        """The group element ``matrix`` acting on an intermediate map ``[..., C, *token_grid.shape]`` (NCHW).

        The patch tokens move as points of :attr:`token_grid` (``token_grid.act``) and the channels
        transform by :attr:`token_type` (``rho_V(g)`` on irrep-wise features, the frame permutation
        on regular ones): ``forward_intermediates(g . x) == intermediate_action(g, forward_intermediates(x))``.
        """
        grid = self._grid()
        g = int(match_matrices(np.asarray(matrix, dtype=np.float64)[None], self.token_type.group.elements)[0])
        axis = -1 - len(grid.shape)
        channels_last = fmap.movedim(axis, -1)
        return grid.act(matrix, self.token_type.act(g, channels_last).movedim(-1, axis))

    # ---------------------------------------------------------------- inference form
    def fold(self) -> nn.Module:
        """The inference form's stream (:mod:`eqvit.nn.stream`), or this model when its stream stays as it is.

        When the final norm is ``F.layer_norm`` in another basis of the stream (``norm.stream_basis()``, the
        equivariant LayerNorm's) and every layer that writes or reads the stream can fold that basis into its weights
        (``fold_in_stream``: the tokenizer, an additive positional scheme, every block), the folded model keeps its
        tokens in that basis: every norm is a bare ``F.layer_norm``, and the readout and the intermediate maps map
        the tokens back first, so ``forward_features`` and ``forward_intermediates`` return what they return
        unfolded. Otherwise this returns the model itself and :func:`eqvit.fold` folds its layers one by one.
        """
        basis = self.norm.stream_basis() if hasattr(self.norm, "stream_basis") else None
        if basis is None:
            return self
        writers = [self.tokenizer] + ([] if self.posenc.is_rotary else [self.posenc])  # rotary: inside attention
        if not all(hasattr(m, "fold_in_stream") for m in [*writers, self.norm, *self.blocks]):
            return self
        blocks = [block.fold_in_stream(basis) for block in self.blocks]
        norm = self.norm.fold_in_stream(basis)
        if norm is None or any(block is None for block in blocks):
            return self  # before any copy: the Schur models land here on every fold
        folded = copy.deepcopy(self)
        # The blocks copied too: what a folded layer keeps of its source (a rotary scheme) is not shared with self.
        folded.blocks, folded.norm = copy.deepcopy(nn.ModuleList(blocks)), norm
        folded.tokenizer = folded.tokenizer.fold_in_stream(basis)
        if not folded.posenc.is_rotary:
            folded.posenc = folded.posenc.fold_in_stream(basis)
        readout = folded.readout
        fold_readout = getattr(readout, "fold_in_stream", None)
        folded.readout = fold_readout(basis) if fold_readout is not None else FromStream(readout, basis)
        folded.to_token_type = FromStream(folded.to_token_type, basis)
        folded.stream_basis = basis
        return folded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, C, *grid]`` (images, the sphere) -> the head's output: logits ``[B, num_classes]`` or a
        field ``[B, out_chans, *grid]``."""
        x = self.input_check(x)
        return self.add_input(self.head(self.features(x, select=self._head_tokens)), x)


class PointCloudViT(EquivariantViT):
    """:class:`EquivariantViT` on point clouds: ``model(pos [B, N, d], feat [B, N, C])``."""

    def forward_features(self, pos: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """``(pos [B, N, d], feat [B, N, C])`` -> the features the head pools ``[B, N, num_features]``."""
        self.input_check(pos, feat)
        return self.features(pos, feat)

    def forward(self, pos: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """``(pos [B, N, d], feat [B, N, C])`` -> the head's output (e.g. logits ``[B, num_classes]``)."""
        self.input_check(pos, feat)
        return self.head(self.features(pos, feat, select=self._head_tokens))
