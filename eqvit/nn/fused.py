"""Inference forms of the equivariant layers: the weights a training layer derives from its
parameters on every call, computed once and kept as buffers.

Nothing here is used by a training forward; :func:`eqvit.fuse` swaps these modules in. Each one
computes the same function as the layer it replaces (the tests check it for every registered model)
and declares the same ``in_type`` / ``out_type``.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.fused_schur import FrozenSchurLinear
from eqvit.nn.irrep_attention import attend_heads, schur_attend
from eqvit.nn.norm import irrep_layer_norm
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.regular import fourier_group_conv
from eqvit.nn.sdpa import ScaledDotProductAttention
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed, IcosphereUnpatchify, lift_patches, unpatchify_patches


def _frozen(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone().contiguous()


class FrozenLinear(nn.Module):
    """``x [..., in] -> x W^T + b`` with a fixed dense ``W [out, in]`` (the inference form of any
    linear map: an irrep-wise linear, a group convolution, a patch embedding with its filter basis)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, in_type=None, out_type=None) -> None:
        super().__init__()
        self.register_buffer("weight", _frozen(weight))
        self.register_buffer("bias", _frozen(bias))
        self.in_type, self.out_type = in_type, out_type

    def extra_repr(self) -> str:
        return f"in={self.weight.shape[1]}, out={self.weight.shape[0]}, bias={self.bias is not None}"

    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight, bias)``, as :meth:`IrrepLinear.dense <eqvit.nn.linear.IrrepLinear.dense>` gives them."""
        return self.weight, self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class FrozenSchurAttention(nn.Module):
    """:class:`~eqvit.nn.irrep_attention.IrrepAttention` in the ``components`` layout with its stacked
    q/k/v slab matrices and projection fixed (:func:`~eqvit.nn.irrep_attention.schur_attend`)."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.in_type = self.out_type = attn.ftype
        mats, biases = attn.schur_qkv()
        self.sizes, self.terms, self.groups = list(attn.q._in_sizes), list(attn._qkv_terms), list(attn._groups)
        _register_list(self, "mat", mats)
        _register_list(self, "bias", biases)
        self.register_buffer("qkv_index", attn.qkv_index.clone(), persistent=False)
        self.register_buffer("out_index", attn.out_index.clone(), persistent=False)
        self.sdpa = ScaledDotProductAttention(0.0, attn.fused)
        self.rotary = attn.rotary
        self.slab_heads = attn._slab_heads
        self.proj = FrozenSchurLinear(attn.proj)

    def forward(self, x: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        """``x [B, N, dim] -> [B, N, dim]``."""
        return schur_attend(
            x, self.sizes, self.terms, _read_list(self, "mat"), _read_list(self, "bias"), self.qkv_index,
            self.out_index, self.rotary, self.groups, self.sdpa, self.proj, rope, num_prefix_tokens,
            self.slab_heads,
        )  # fmt: skip


def _register_list(module: nn.Module, prefix: str, tensors: list) -> None:
    module._list_sizes = getattr(module, "_list_sizes", {})
    module._list_sizes[prefix] = len(tensors)
    for n, t in enumerate(tensors):
        module.register_buffer(f"{prefix}_{n}", _frozen(t))


def _read_list(module: nn.Module, prefix: str) -> list:
    buffers = module._buffers
    return [buffers[f"{prefix}_{n}"] for n in range(module._list_sizes[prefix])]


class FrozenFourierConv(nn.Module):
    """A group convolution in the Fourier domain with its per-irrep kernels fixed (the inference form
    of :class:`~eqvit.nn.regular.GroupConvLinear` with ``impl="fourier"``): ``[..., |G| C_in] -> [..., |G| C_out]``."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.order, self.in_channels, self.out_channels = conv.order, conv.in_channels, conv.out_channels
        self.irrep_dims = list(conv.irrep_dims)
        self.in_type, self.out_type = conv.in_type, conv.out_type
        self.register_buffer("fourier", _frozen(conv.fourier))
        self.register_buffer("inverse_fourier", _frozen(conv.inverse_fourier))
        for n, kernel in enumerate(conv.fourier_kernels()):
            self.register_buffer(f"kernel_{n}", _frozen(kernel))
        self.register_buffer("bias", _frozen(conv.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = [getattr(self, f"kernel_{n}") for n in range(len(self.irrep_dims))]
        return fourier_group_conv(x, self.fourier, self.inverse_fourier, kernels, self.irrep_dims, self.bias)


class FrozenLayerNorm(nn.Module):
    """``F.layer_norm`` over the last axis with a fixed affine (a frame-shared LayerNorm's tiled one)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, eps: float, in_type=None) -> None:
        super().__init__()
        self.register_buffer("weight", _frozen(weight))
        self.register_buffer("bias", _frozen(bias))
        self.eps, self.in_type, self.out_type = eps, in_type, in_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class FrozenIrrepLayerNorm(nn.Module):
    """:class:`~eqvit.nn.norm.IrrepLayerNorm` with its per-coordinate affine fixed: six ops per token."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        gamma, beta, mask = norm.affine()
        dim = norm.ftype.dim
        self.in_type = self.out_type = norm.ftype
        self.register_buffer("gamma", _frozen(gamma * math.sqrt(dim)))
        self.register_buffer("beta", _frozen(beta))
        self.register_buffer("mask", _frozen(mask))
        self.register_buffer("neg_center_col", _frozen(norm.neg_center_col))
        self.register_buffer("root", beta.new_tensor(math.sqrt(dim * norm.eps)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return irrep_layer_norm(x, self.neg_center_col, self.mask, self.gamma, self.beta, self.root)


class FrozenIrrepAttention(nn.Module):
    """Irrep-wise attention with its fused ``qkv`` and projection matrices fixed.

    The head layout (sizes and order) is the source layer's, its coordinates folded into the rows of
    ``qkv`` and the columns of ``proj``; :meth:`forward` is the source's ``attend``.
    """

    def __init__(self, attn: nn.Module, weights: tuple | None = None) -> None:
        super().__init__()
        qkv_w, qkv_b, proj_w, proj_b = attn.fused_weights() if weights is None else weights
        self.in_type = self.out_type = attn.ftype
        self.groups = list(attn._groups)
        self.sdpa = ScaledDotProductAttention(0.0, attn.fused)
        self.qkv = FrozenLinear(qkv_w, qkv_b)
        self.proj = FrozenLinear(proj_w, proj_b)
        self.rotary = attn.rotary  # frame RoPE in the frame basis (fixed geometry), or no rotary scheme

    def forward(self, x: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        """``x [B, N, dim] -> [B, N, dim]``."""
        qkv = self.rotary(self.qkv(x), rope, num_prefix_tokens)  # [B, N, 3 dim], heads side by side
        return self.proj(attend_heads(qkv, self.groups, self.sdpa))


class FrozenMlp(nn.Module):
    """``fc2(act(fc1(x)))`` with fixed dense weights: a Fourier-nonlinearity MLP with its transforms
    folded into the linear maps (hidden width |X|, pointwise ``act``), timm's ``Mlp`` shape."""

    def __init__(self, w1, b1, act: nn.Module, w2, b2, in_type=None) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = FrozenLinear(w1, b1), act, FrozenLinear(w2, b2)
        self.in_type = self.out_type = in_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class FrozenAPE(PositionalScheme):
    """An absolute positional encoding ``x [B, M, C] -> x + p`` with ``p [M, C]`` fixed."""

    def __init__(self, embedding: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("embedding", _frozen(embedding))
        self.num_tokens = embedding.shape[0]

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.num_tokens:
            raise ValueError(f"expected {self.num_tokens} tokens, got {x.shape[1]}")
        return x + self.embedding


class FrozenIcosphereLift(ExactBuffers):
    """:class:`~eqvit.nn.tokenizers.icosphere.IcospherePatchEmbed` with its three turned kernels computed once."""

    def __init__(self, embed: IcospherePatchEmbed) -> None:
        super().__init__()
        weight, bias = embed.turned_weights()
        self.register_buffer("face_index", embed.face_index.clone())
        self.register_buffer("weight", _frozen(weight))
        self.register_buffer("bias", _frozen(bias))
        self.lifting = embed.lifting

    @property
    def num_tokens(self) -> int:
        return self.lifting.num_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, C, V] -> tokens [B, 3M, D]``."""
        return lift_patches(x, self.face_index, self.weight, self.bias)


class FrozenIcosphereUnpatchify(ExactBuffers):
    """:class:`~eqvit.nn.tokenizers.icosphere.IcosphereUnpatchify` with its turned kernels and summed biases
    computed once."""

    def __init__(self, head: IcosphereUnpatchify) -> None:
        super().__init__()
        weight, bias = head.turned_weights()
        self.register_buffer("weight", _frozen(weight))
        self.register_buffer("bias", _frozen(bias))
        self.register_buffer("scatter_index", head.scatter_index.clone())
        # Exact as in the training form: a fused model cast to float64 keeps 1/count exact.
        self.register_exact_buffer("inv_count", head.exact_buffer("inv_count"))
        self.to(device=head.inv_count.device, dtype=head.inv_count.dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, 3M, D] -> [B, C_out, V]``."""
        return unpatchify_patches(tokens, self.weight, self.bias, self.scatter_index, self.inv_count)


class FoldedInvariantHead(nn.Module):
    """:class:`~eqvit.nn.irrep_blocks.InvariantHead` with its classifier folded into two matrices:
    ``logits = cls @ A + sqrt(cls^2 @ S) @ W_n^T + b`` (``A`` reads the trivial coordinates, ``S``
    sums squares per irrep copy): four small ops instead of gathers, padding and concatenation."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        fc = head.fc
        n = len(head.trivial)
        self.num_classes, self.num_features = head.num_classes, head.num_features
        self.register_buffer("reads_trivial", _frozen(head.trivial_select @ fc.weight[:, :n].T))
        self.register_buffer("reads_norms", _frozen(fc.weight[:, n:].T))
        self.register_buffer("bias", _frozen(fc.bias))
        self.register_buffer("group_squares", _frozen(head.group_squares))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cls = tokens[:, 0]
        norms = torch.sqrt((cls * cls) @ self.group_squares)
        return torch.addmm(torch.addmm(self.bias, cls, self.reads_trivial), norms, self.reads_norms)


# ---------------------------------------------------------------------------------------------------
# The reflected residual stream of irrep-wise models (see eqvit.nn.norm): every norm one F.layer_norm.


class ReflectedPlanarEmbedding(nn.Module):
    """Patch embedding, invariant APE and class token of a planar tokenizer, reflected into the stream's
    basis ``H``: ``x [B, C, *spatial] -> H tokens [B, 1 + M, dim]`` (one GEMM plus an add)."""

    def __init__(self, tokenizer: nn.Module, posenc: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        filters, bias = tokenizer.embed.dense()
        cls = tokenizer.class_token() if tokenizer.cls_token is not None else None
        # The tokenizer is kept for its unfold only: its own weights go (they are folded below).
        self.tokenizer = copy.deepcopy(tokenizer)
        self.tokenizer.embed, self.tokenizer.cls_token = nn.Identity(), None
        self.register_buffer("filters", _frozen(norm.reflect(filters.T).T))  # H is symmetric: H F = (F^T H)^T
        self.register_buffer("bias", _frozen(None if bias is None else norm.reflect(bias)))
        self.register_buffer("pos", _frozen(norm.reflect(posenc.embedding())))
        self.register_buffer("cls", _frozen(None if cls is None else norm.reflect(cls)))
        self.num_prefix_tokens = int(cls is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = self.tokenizer.patch_tokens_with(x, self.filters, self.bias)  # [B, M, dim]
        if self.cls is None:
            return patches + self.pos
        B, M, dim = patches.shape
        stream = patches.new_empty(B, 1 + M, dim)  # add straight into the stream
        stream[:, 0] = self.cls
        torch.add(patches, self.pos, out=stream[:, 1:])
        return stream


class ReflectedIrrepBlock(nn.Module):
    """An irrep-wise block on the reflected stream ``H x -> H block(x)``: each norm is one
    ``F.layer_norm``, its affine and reflection folded into the layer that reads it; the layers that
    write into the stream fold ``H`` into their outputs."""

    def __init__(self, block: nn.Module, norm_eps: float) -> None:
        super().__init__()
        attn, mlp, norm1, norm2 = block.attn, block.mlp, block.norm1, block.norm2
        qkv_w, qkv_b, proj_w, proj_b = attn.fused_weights()
        attn_weights = (*norm1.fold(qkv_w, qkv_b), *norm1.fold_output(proj_w, proj_b))
        w1, b1, w2, b2 = mlp.folded_weights()
        self.attn = FrozenIrrepAttention(attn, attn_weights)
        self.mlp = FrozenMlp(*norm2.fold(w1, b1), mlp.act.act, *norm2.fold_output(w2, b2))
        dim = attn.ftype.dim
        self.register_buffer("unit_weight", torch.ones(dim, dtype=qkv_w.dtype, device=qkv_w.device))
        self.register_buffer("unit_bias", torch.zeros(dim, dtype=qkv_w.dtype, device=qkv_w.device))
        self.eps = norm_eps
        self.in_type = self.out_type = None  # the stream is in the reflected basis, not a feature type

    def _layer_norm(self, y: torch.Tensor) -> torch.Tensor:
        # The unit affine: F.layer_norm's CPU kernel is ~1.7x slower with weight=None, bias=None.
        return F.layer_norm(y, self.unit_weight.shape, self.unit_weight, self.unit_bias, self.eps)

    def forward(self, y: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        y = y + self.attn(self._layer_norm(y))
        return y + self.mlp(self._layer_norm(y))


class ReflectedFinalNorm(nn.Module):
    """The final norm read from the reflected stream: ``H x -> norm(x)`` (irrep-wise tokens again)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        gamma, beta, _ = norm.affine()
        dim = norm.ftype.dim
        self.in_type = self.out_type = norm.ftype
        self.register_buffer("gamma", _frozen(gamma))
        self.register_buffer("beta", _frozen(beta))
        self.register_buffer("reflect_col", _frozen(norm.reflect_col))
        self.register_buffer("reflect_row", _frozen(norm.reflect_row))
        self.register_buffer("unit_weight", torch.ones(dim, dtype=gamma.dtype, device=gamma.device))
        self.register_buffer("unit_bias", torch.zeros(dim, dtype=gamma.dtype, device=gamma.device))
        self.eps = norm.eps

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        z = F.layer_norm(y, self.unit_weight.shape, self.unit_weight, self.unit_bias, self.eps)  # H z / rms(z)
        z = torch.addcmul(z, z @ self.reflect_col, self.reflect_row)  # H again: z / rms(z)
        return torch.addcmul(self.beta, z, self.gamma)


class FrozenSquareLift(nn.Module):
    """:class:`~eqvit.nn.tokenizers.platonic.LiftedSquarePatchEmbed` with its steered kernels fixed:
    one strided ``F.conv2d`` with ``|G| C`` output channels, ``[B, C_in, S, S] -> [B, (S/P)^2, |G| C]``."""

    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.register_buffer("weight", _frozen(embed.steered_weight()))
        self.register_buffer("bias", _frozen(embed.bias.repeat(embed.order)))
        self.patch_size, self.positions, self.num_tokens = embed.patch_size, embed.positions, embed.num_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.conv2d(x, self.weight, self.bias, stride=self.patch_size)
        return out.flatten(2).transpose(1, 2).contiguous()  # the stream token-major, not a transposed view
