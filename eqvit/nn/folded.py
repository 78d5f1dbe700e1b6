"""Folded layers: what a training layer derives from its parameters on every call, computed once.

Each training layer that can be re-parameterised for inference has a ``fold()`` method returning one of
these modules (timm's ``reparameterize_model`` idiom); :func:`eqvit.fold` only walks a model and calls it.
A folded module has the layer's ``in_type`` / ``out_type`` and forward signature and computes the same
function; its weights are buffers, so ``state_dict`` round trips and ``.to()`` keep them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_attention import attend_heads
from eqvit.nn.norm import irrep_layer_norm
from eqvit.nn.posenc.base import PositionalScheme
from eqvit.nn.regular import fourier_group_conv
from eqvit.nn.schur import SlabPlan, apply_slabs
from eqvit.nn.sdpa import ScaledDotProductAttention
from eqvit.nn.tokenizers.icosphere import lift_patches, unpatchify_patches
from eqvit.nn.tokenizers.platonic import lift_square_patches


def frozen(t: torch.Tensor | None) -> torch.Tensor | None:
    """A detached contiguous copy (None stays None)."""
    return None if t is None else t.detach().clone().contiguous()


class FoldedLinear(nn.Module):
    """``x [..., in] -> x W^T + b`` with a fixed dense ``W [out, in]`` (an irrep-wise linear in the ``copies``
    layout, a group convolution on frames, a patch embedding with its filter basis)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, in_type=None, out_type=None) -> None:
        super().__init__()
        self.register_buffer("weight", frozen(weight))
        self.register_buffer("bias", frozen(bias))
        self.in_type, self.out_type = in_type, out_type

    def extra_repr(self) -> str:
        return f"in={self.weight.shape[1]}, out={self.weight.shape[0]}, bias={self.bias is not None}"

    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight, bias)``, as :meth:`IrrepLinear.dense <eqvit.nn.linear.IrrepLinear.dense>` gives them."""
        return self.weight, self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class FoldedSchurLinear(nn.Module):
    """A Schur linear (:mod:`eqvit.nn.schur`) with its slab matrices fixed: ``[..., in.dim] -> [..., out.dim]``.

    The folded form of :class:`~eqvit.nn.linear.IrrepLinear` in the ``components`` layout and of
    :class:`~eqvit.nn.regular.GroupConvLinear` in the Fourier basis; layers that read a Schur linear's slabs
    (the row forms of the Fourier MLP and attention) call :meth:`slab_weights` on it as on those.
    """

    def __init__(
        self,
        plan: SlabPlan,
        mats: Sequence[torch.Tensor | None],
        biases: Sequence[torch.Tensor | None],
        in_type=None,
        out_type=None,
    ) -> None:
        super().__init__()
        self.plan, self.in_type, self.out_type = plan, in_type, out_type
        self.num_slabs = len(plan.terms)
        # Slabs sharing one matrix (the components of a real-type irrep) keep one buffer.
        self._mat_of: list[int] = []
        kept: dict[int, int] = {}
        for mat in mats:
            if mat is None:
                self._mat_of.append(-1)
                continue
            key = id(mat)
            if key not in kept:
                kept[key] = len(kept)
                self.register_buffer(f"mat_{kept[key]}", frozen(mat))
            self._mat_of.append(kept[key])
        for t, bias in enumerate(biases):
            self.register_buffer(f"bias_{t}", frozen(bias))

    def extra_repr(self) -> str:
        return f"{self.in_type} -> {self.out_type}, slabs={self.num_slabs}"

    def slab_weights(self) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        buffers = self._buffers
        mats = [None if n < 0 else buffers[f"mat_{n}"] for n in self._mat_of]
        return mats, [buffers[f"bias_{t}"] for t in range(self.num_slabs)]

    def dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The dense ``(weight [out, in], bias [out] or None)`` (for layers that fold a basis into it)."""
        mats, biases = self.slab_weights()
        like = next((t for t in self._buffers.values() if t is not None), None)
        eye = torch.eye(sum(self.plan.in_sizes), dtype=None if like is None else like.dtype)
        weight = apply_slabs(eye, self.plan, mats, [None] * self.num_slabs).T
        if all(b is None for b in biases):
            return weight, None
        return weight, torch.cat([eye.new_zeros(w) if b is None else b for (_, w), b in zip(self.plan.terms, biases)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_slabs(x, self.plan, *self.slab_weights())


class FoldedFourierConv(nn.Module):
    """A frame-basis group convolution in the Fourier domain (``impl="fourier"``) with its per-irrep kernels
    fixed: ``[..., |G| C_in] -> [..., |G| C_out]``."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.irrep_dims = list(conv.irrep_dims)
        self.in_type, self.out_type = conv.in_type, conv.out_type
        self.register_buffer("fourier", frozen(conv.fourier))
        self.register_buffer("inverse_fourier", frozen(conv.inverse_fourier))
        for n, kernel in enumerate(conv.fourier_kernels()):
            self.register_buffer(f"kernel_{n}", frozen(kernel))
        self.register_buffer("bias", frozen(conv.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = [self._buffers[f"kernel_{n}"] for n in range(len(self.irrep_dims))]
        return fourier_group_conv(x, self.fourier, self.inverse_fourier, kernels, self.irrep_dims, self.bias)


class FoldedLayerNorm(nn.Module):
    """``F.layer_norm`` over the last axis with a fixed affine (a frame-shared LayerNorm's tiled one)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, eps: float, in_type=None) -> None:
        super().__init__()
        self.register_buffer("weight", frozen(weight))
        self.register_buffer("bias", frozen(bias))
        self.eps, self.in_type, self.out_type = eps, in_type, in_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class FoldedIrrepLayerNorm(nn.Module):
    """:class:`~eqvit.nn.norm.IrrepLayerNorm` with its per-coordinate affine fixed."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        gamma, beta, mask = norm.affine()
        dim = norm.in_type.dim
        self.in_type = self.out_type = norm.in_type
        self.register_buffer("gamma", frozen(gamma * math.sqrt(dim)))
        self.register_buffer("beta", frozen(beta))
        self.register_buffer("mask", frozen(mask))
        self.register_buffer("neg_center_col", frozen(norm.neg_center_col))
        self.register_buffer("dim_eps", beta.new_tensor(dim * norm.eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return irrep_layer_norm(x, self.neg_center_col, self.mask, self.gamma, self.beta, self.dim_eps)


class FoldedIrrepAttention(nn.Module):
    """Irrep-wise attention with its dense ``qkv`` and projection fixed: the head layout (sizes and order) is
    the source layer's, its coordinates folded into the rows of ``qkv`` and the columns of ``proj``."""

    def __init__(self, attn: nn.Module, weights: tuple, in_type=None) -> None:
        super().__init__()
        qkv_w, qkv_b, proj_w, proj_b = weights
        self.in_type = self.out_type = in_type if in_type is not None else attn.in_type
        self.groups = list(attn.head_groups)
        self.sdpa = ScaledDotProductAttention(0.0, attn.fused)
        self.qkv = FoldedLinear(qkv_w, qkv_b)
        self.proj = FoldedLinear(proj_w, proj_b)
        self.rotary = attn.rotary  # frame RoPE in the frame basis (fixed geometry), or no rotary scheme

    def forward(self, x: torch.Tensor, rope=None, num_prefix_tokens: int = 0) -> torch.Tensor:
        """``x [B, N, dim] -> [B, N, dim]``."""
        qkv = self.rotary(self.qkv(x), rope, num_prefix_tokens)  # [B, N, 3 dim], heads side by side
        return self.proj(attend_heads(qkv, self.groups, self.sdpa))


class FoldedMlp(nn.Module):
    """``fc2(act(fc1(x)))`` with fixed dense weights: a Fourier-nonlinearity MLP with its transforms folded
    into the linear maps (hidden width |X|, pointwise ``act``), timm's ``Mlp`` shape."""

    def __init__(self, w1, b1, act: nn.Module, w2, b2, in_type=None) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = FoldedLinear(w1, b1), act, FoldedLinear(w2, b2)
        self.in_type = self.out_type = in_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class FoldedTokenInvariants(nn.Module):
    """:class:`~eqvit.nn.irrep_blocks.TokenInvariants` reading tokens kept in a stream basis ``Q``
    (:mod:`eqvit.nn.stream`): ``y [..., d] -> [..., num_features]``. One linear map takes ``y`` back to the trivial
    coordinates and then to all of them, whose squares the readout's own membership GEMM sums by group. No clamp
    before the square root: it only keeps a gradient finite, and this form has none."""

    def __init__(self, readout: nn.Module, basis: nn.Module) -> None:
        super().__init__()
        q = basis.matrix
        self.num_trivial = len(readout.trivial)
        # [x_trivial, x] = y Q^T[:, trivial + all]
        self.register_buffer("weight", frozen(torch.cat([q[readout.trivial_index], q])))
        self.register_buffer("membership", frozen(readout.membership.to(q.dtype)))
        self.in_type, self.num_features = None, readout.num_features

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        x = F.linear(y, self.weight)
        tokens = x[..., self.num_trivial :]
        return torch.cat([x[..., : self.num_trivial], ((tokens * tokens) @ self.membership).sqrt()], dim=-1)


class FoldedAPE(PositionalScheme):
    """An absolute positional encoding ``x [B, M, C] -> x + p`` with ``p [M, C]`` fixed."""

    def __init__(self, embedding: torch.Tensor, in_type=None) -> None:
        super().__init__()
        self.register_buffer("embedding", frozen(embedding))
        self.num_tokens = embedding.shape[0]
        self.in_type = self.out_type = in_type

    def add_to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        # torch._assert: the model makes the tokens (its input check covers user input); traceable by torch.fx
        torch._assert(x.shape[1] == self.num_tokens, f"expected {self.num_tokens} tokens")
        return x + self.embedding


class FoldedClassToken(nn.Module):
    """Prepends a fixed class token ``token [D]``: ``[B, M, D] -> [B, 1 + M, D]``."""

    num_prefix_tokens = 1

    def __init__(self, token: torch.Tensor, out_type=None) -> None:
        super().__init__()
        self.register_buffer("token", frozen(token))
        self.in_type = self.out_type = out_type

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(tokens.shape[0], 1, -1), tokens], dim=1)


class FoldedIcosphereLift(nn.Module):
    """:class:`~eqvit.nn.tokenizers.icosphere.IcospherePatchEmbed` with its three turned kernels fixed."""

    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        weight, bias = embed.turned_weights()
        self.register_buffer("face_index", embed.face_index.clone(), persistent=False)
        self.register_buffer("weight", frozen(weight))
        self.register_buffer("bias", frozen(bias))
        self.lifting, self.in_chans, self.num_vertices = embed.lifting, embed.in_chans, embed.num_vertices

    @property
    def num_tokens(self) -> int:
        return self.lifting.num_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, C, V] -> tokens [B, 3M, D]``."""
        return lift_patches(x, self.face_index, self.weight, self.bias)


class FoldedIcosphereUnpatchify(ExactBuffers):
    """:class:`~eqvit.nn.tokenizers.icosphere.IcosphereUnpatchify` with its turned kernels and summed biases fixed."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        weight, bias = head.turned_weights()
        self.register_buffer("weight", frozen(weight))
        self.register_buffer("bias", frozen(bias))
        self.register_buffer("scatter_index", head.scatter_index.clone(), persistent=False)
        # Exact as in the training form: a folded model cast to float64 keeps 1/count exact.
        self.register_exact_buffer("inv_count", head.exact_buffer("inv_count"), like=weight)
        self.lifting, self.out_chans, self.num_vertices = head.lifting, head.out_chans, head.num_vertices

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B, 3M, D] -> [B, C_out, V]``."""
        return unpatchify_patches(tokens, self.weight, self.bias, self.scatter_index, self.inv_count)


class FoldedSquareLift(nn.Module):
    """:class:`~eqvit.nn.tokenizers.platonic.LiftedSquarePatchEmbed` with its steered kernels fixed: one
    strided ``F.conv2d`` with ``|G| C`` output channels, ``[B, C_in, S, S] -> [B, (S/P)^2, |G| C]``."""

    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        weight, bias = embed.steered_weight()
        self.register_buffer("weight", frozen(weight))
        self.register_buffer("bias", frozen(bias))
        self.patch_size, self.positions, self.num_tokens = embed.patch_size, embed.positions, embed.num_tokens
        self.in_type, self.out_type = embed.in_type, embed.out_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lift_square_patches(x, self.weight, self.bias, self.patch_size)
