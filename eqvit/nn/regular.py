"""Layers on regular features: functions on a finite group G (Platonic Transformer seed, Sec. 3).

A token's feature is ``f: G -> R^C`` stored flat as ``[..., |G| * C]``, frame-major (entry
``g * C + c`` is channel c seen from frame ``R_g``). G acts by ``(L_g f)(R) = f(g^-1 R)``, a
permutation of the frame axis: with the Cayley table, frame j of ``L_g f`` is frame
``cayley[inverse[g], j]`` of ``f``. Every layer here commutes with that permutation:

- :class:`LiftToGroup`: scalars copied over frames, vectors seen from each frame ``f(R) = R^-1 u``;
- :class:`GroupConvLinear`: group convolution ``y(R) = sum_h W(h) f(R h)``, i.e. the block matrix
  ``[W]_{R, R'} = W(R^-1 R')``, as a Cayley-gathered dense matrix or in the Fourier domain;
- :class:`RegularLayerNorm`, :class:`RegularLayerScale`: statistics and scales shared across frames;
- :func:`frame_action`: the action itself, for tests and users.

The same features have a second basis, the group Fourier transform of every channel (:class:`RegularBasis`):
``C`` copies of the regular representation in the ``components`` layout, coordinate ``s * C + c`` holding
Fourier coefficient ``s`` of channel ``c``. There a group convolution is a Schur linear
(:mod:`eqvit.nn.schur`, ``sum_rho d_rho m_rho^2`` instead of ``|G|^2`` multiply-adds per channel pair: 12/64
for D4), the frame-shared LayerNorm centres the trivial coefficients only (:class:`FourierLayerNorm`), and
LayerScale is unchanged. ``GroupConvLinear(..., basis="fourier")`` keeps the kernel ``W(h)`` as its parameter
and derives the slab matrices from it, so a model in either basis has the same parameters and, loaded with
the same state dict, computes the same function.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eqvit.groups import FiniteGroup
from eqvit.nn.activation import homogeneous_fourier_basis
from eqvit.nn.buffers import ExactBuffers
from eqvit.nn.irrep_features import FeatureType
from eqvit.nn.norm import IrrepLayerNorm
from eqvit.nn.schur import SlabPlan, apply_slabs, slab_plan

IMPLEMENTATIONS = ("auto", "cayley", "fourier", "windows")
BASES = ("frames", "fourier")
# impl="auto" takes the Fourier form below this multiply-add ratio of the Cayley form: above it, the Fourier
# form's per-irrep calls cost more than one dense GEMM saves (benchmarks/platonic_speed.py's group-convolution
# table).
FOURIER_COST_RATIO = 0.2


def frame_action(group: FiniteGroup, g: int, x: torch.Tensor) -> torch.Tensor:
    """``L_g`` on regular features ``x [..., |G| * C]``: ``(L_g f)(R_j) = f(R_{cayley[g^-1, j]})``
    (the action of :meth:`FeatureType.frames <eqvit.nn.irrep_features.FeatureType.frames>`)."""
    return FeatureType.frames(group, x.shape[-1] // group.order).act(g, x)


class LiftToGroup(ExactBuffers):
    """Lift scalars and 3-D (or 2-D) vectors in the global frame to regular features.

    ``scalars [..., S]`` are copied to every frame; ``vectors [..., V, d]`` become
    ``f(R) = R^T u`` (the vector seen from frame R). Output ``[..., |G| * (S + V * d)]``.
    """

    def __init__(self, group: FiniteGroup) -> None:
        super().__init__()
        self.order, self.dim = group.order, group.dim
        self.register_exact_buffer("frames", torch.from_numpy(group.elements.copy()))

    def lifted_channels(self, num_scalars: int, num_vectors: int) -> int:
        """Channels per frame after lifting ``S`` scalars and ``V`` vectors: ``S + V * d``."""
        return num_scalars + num_vectors * self.dim

    def forward(self, scalars: torch.Tensor | None = None, vectors: torch.Tensor | None = None) -> torch.Tensor:
        parts = []
        if scalars is not None:
            parts.append(scalars.unsqueeze(-2).expand(*scalars.shape[:-1], self.order, scalars.shape[-1]))
        if vectors is not None:
            if vectors.shape[-1] != self.dim:
                raise ValueError(f"expected vectors [..., V, {self.dim}], got {list(vectors.shape)}")
            # R^T u for every frame R: [..., V, d] -> [..., G, V * d]
            seen = torch.einsum("gji,...vj->...gvi", self.frames, vectors)
            parts.append(seen.flatten(-2))
        if not parts:
            raise ValueError("LiftToGroup needs scalars, vectors or both")
        return torch.cat(parts, dim=-1).flatten(-2)


def _fourier_matrices(group: FiniteGroup) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The group Fourier transform on C(G): ``T [K, |G|]`` with rows ``rho(g)_{ab}``, its pseudo-inverse.

    ``K = sum_rho dim(rho)^2``. For complex-type irreps the matrix entries are linearly dependent,
    so the inverse is the pseudo-inverse (exact on the image of T, which every transformed feature
    lies in). Returns ``(T, T^+, dims)``.
    """
    rows = [rho.matrices.reshape(group.order, -1).T for rho in group.irreps]
    transform = np.concatenate(rows, axis=0)
    return transform, np.linalg.pinv(transform), [rho.dim for rho in group.irreps]


def fourier_group_conv(
    x: torch.Tensor,
    fourier: torch.Tensor,
    inverse_fourier: torch.Tensor,
    kernels: list[torch.Tensor],
    irrep_dims: list[int],
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """A group convolution in the Fourier domain: ``x [..., |G| C_in] -> [..., |G| C_out]``.

    ``fourier [K, |G|]`` and ``inverse_fourier [|G|, K]`` transform the frame axis (:func:`_fourier_matrices`),
    ``kernels[rho] [d C_in, d C_out]`` are the per-irrep ``W_hat(rho)^T``, ``bias [C_out]`` is shared over frames.
    """
    G = fourier.shape[1]
    I = kernels[0].shape[0] // irrep_dims[0]
    O = kernels[0].shape[1] // irrep_dims[0]
    x_hat = torch.matmul(fourier, x.reshape(-1, G, I))  # [M, K, C_in]
    outputs, row = [], 0
    for d, kernel in zip(irrep_dims, kernels):
        block = x_hat[:, row : row + d * d].reshape(-1, d, d * I)  # [M, a, (b, i)]
        outputs.append((block @ kernel).reshape(-1, d * d, O))
        row += d * d
    y = torch.matmul(inverse_fourier, torch.cat(outputs, dim=1))  # [M, G, C_out]
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], G * O)


@cache
def _regular_fourier_q(group: FiniteGroup) -> np.ndarray:
    """``Q [|G|, |G|]`` orthogonal: one function on G's frames ``= Q @`` its Fourier coefficients, the
    coefficients in the ``components`` layout of one regular copy (:func:`homogeneous_fourier_basis`)."""
    _, basis, _ = homogeneous_fourier_basis(group, [("regular", 1)], layout="components")
    basis.setflags(write=False)
    return basis


class RegularBasis:
    """``C`` copies of the regular representation of ``group`` in the Fourier basis.

    Attributes:
        ftype: the ``components``-layout type of the coefficients, coordinate ``s * C + c`` being coefficient
            ``s`` of channel ``c``.
        q: float64 ``[|G|, |G|]`` orthogonal, ``frames [..., |G|, C] = q @ coefficients [..., |G|, C]``.
        transform: float64 ``[|G| C, |G| C]`` ``= q (x) I_C``: ``coefficients = frames @ transform`` (flat).
        basis: float64 ``[|G| C, |G| C]`` the :func:`homogeneous_fourier_basis` matrix of ``C`` regular orbits
            (orbit-major rows), what a :class:`~eqvit.nn.activation.FourierActivation` on :attr:`ftype` takes.
    """

    def __init__(self, group: FiniteGroup, channels: int) -> None:
        self.group, self.channels = group, channels
        self.ftype = FeatureType.regular(group, channels, layout="components")
        self.q = _regular_fourier_q(group)

    @property
    def transform(self) -> np.ndarray:
        return np.kron(self.q, np.eye(self.channels))

    @property
    def basis(self) -> np.ndarray:
        G, C = self.group.order, self.channels
        return np.einsum("js,cd->cjsd", self.q, np.eye(C)).reshape(G * C, G * C)

    def trivial_scale(self) -> float:
        """``s`` with ``coefficients = s * b`` on the trivial row for a per-channel ``b`` tiled over the frames."""
        ones = self.q.T @ np.ones(self.group.order)
        if not np.allclose(ones[1:], 0.0, atol=1e-12):
            raise ValueError(f"the trivial Fourier coefficient of {self.group.name} is not the first")
        return float(ones[0])


@cache
def _conv_coefficients(group: FiniteGroup) -> tuple[list[np.ndarray], list[int]]:
    """The group convolution in the Fourier basis, per irrep block of one regular copy: ``K [|G|, p, p]``
    with the block of a kernel ``W`` equal to ``sum_h K[h] (x) W(h)``; ``p = m`` (a real-type irrep's copies,
    shared by its ``d`` components) or ``p = d m`` (the whole block otherwise). Returns ``(K per irrep block,
    slabs of each block)``."""
    G, q = group.order, _regular_fourier_q(group)
    kernel_index = group.cayley[group.inverse[:, None], np.arange(G)[None, :]]
    one = RegularBasis(group, 1).ftype
    coefficients, slabs = [], []
    for _, rho, c, sl in one.blocks():
        frames = (kernel_index[None] == np.arange(G)[:, None, None]).astype(np.float64)  # [h, r, s]
        blocks = np.einsum("ra,hrs,sb->hab", q, frames, q)[:, sl, sl]  # Q^T P_h Q on this irrep's block
        if rho.type == "real":
            m = c
            shared = blocks[:, :m, :m]
            if not np.allclose(blocks, np.einsum("ab,hkl->hakbl", np.eye(rho.dim), shared).reshape(blocks.shape)):
                raise ValueError(
                    f"the convolution of {group.name} does not share its blocks over {rho.name}'s components"
                )
            coefficients.append(np.ascontiguousarray(shared))
            slabs.append(rho.dim)
        else:
            coefficients.append(np.ascontiguousarray(blocks))
            slabs.append(1)
    return coefficients, slabs


class GroupConvLinear(ExactBuffers):
    """Equivariant linear map on regular features: a group convolution over the frames.

    ``y(R) = sum_h W(h) f(R h) + b``, i.e. ``[W]_{R, R'} = W(R^-1 R')`` (seed eq. for Phi), with a
    kernel ``W: G -> R^{C_out x C_in}`` (``|G|`` times fewer parameters than a dense layer of the
    same size) and a bias shared over frames. On features in the frame basis (``basis="frames"``) two
    exact implementations:

    - ``"cayley"``: gather the ``[|G| C_out, |G| C_in]`` matrix through the Cayley table, one GEMM;
      With few input rows (``2 * rows < C_out``, e.g. a pooled readout) it gathers the ``|G|``
      frame windows of the input instead, ``y(R) = [W(u)]_u [f(R u)]_u``: the same products
      without materialising the ``|G|`` times larger matrix;
    - ``"fourier"``: transform the frame axis with the irreps, apply ``W_hat(rho) = sum_h rho(h) x W(h)``
      per irrep (``sum dim^3`` instead of ``|G|^2`` multiply-adds per channel pair), transform back.

    ``"auto"`` picks the Fourier form when it needs under a fifth of the dense form's
    multiply-adds (the dense GEMM runs closer to peak; the threshold is calibrated by
    ``benchmarks/platonic_speed.py``).

    With ``basis="fourier"`` the features are Fourier coefficients (:class:`RegularBasis`) and the layer is
    a Schur linear (:mod:`eqvit.nn.schur`): its slab matrices ``sum_h K(h) (x) W(h)`` are derived from the
    kernel on every call (a ``|G| C_out C_in`` contraction per irrep, once per call, not per token).
    Every form's weights are derived on every call; :meth:`fold` fixes them for inference.

    Args:
        group: the frames G.
        in_channels, out_channels: C_in, C_out per frame.
        bias: a bias ``[C_out]`` shared by all frames.
        impl: ``"auto"`` (the Fourier form where it costs less, else the Cayley form), ``"cayley"`` (the dense
            matrix gathered from the kernel), ``"fourier"`` or ``"windows"`` (the input gathered instead of the
            weight: for layers that see few rows, e.g. a classifier's pooled token; :meth:`forward_windows`);
            frame basis only.
        basis: ``"frames"`` or ``"fourier"``: the basis of the input and output features.

    Shapes: ``[..., |G| * C_in] -> [..., |G| * C_out]``.
    """

    def __init__(
        self,
        group: FiniteGroup,
        in_channels: int,
        out_channels: int,
        bias: bool = True,
        impl: str = "auto",
        basis: str = "frames",
    ) -> None:
        super().__init__()
        if impl not in IMPLEMENTATIONS:
            raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLEMENTATIONS)}")
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r}; valid: {', '.join(BASES)}")
        G = group.order
        self.group = group
        self.order, self.in_channels, self.out_channels = G, in_channels, out_channels
        self.basis = basis
        self.weight = nn.Parameter(torch.empty(G, out_channels, in_channels))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        nn.init.trunc_normal_(self.weight, std=0.02)
        # kernel_index[r, s] = index of R_r^-1 R_s: which kernel value sits in block (r, s) on frames.
        kernel_index = group.cayley[group.inverse[:, None], np.arange(G)[None, :]]
        self.register_buffer("kernel_index", torch.from_numpy(kernel_index), persistent=False)
        if basis == "fourier":
            self._init_fourier_basis(group)
            return
        self.in_type, self.out_type = FeatureType.frames(group, in_channels), FeatureType.frames(group, out_channels)
        # frame_windows[r * |G| + u] = index of R_r u: the frames that frame r's output reads through W(u).
        self.register_buffer("frame_windows", torch.from_numpy(group.cayley.flatten()), persistent=False)
        transform, inverse, dims = _fourier_matrices(group)
        self.irrep_dims = dims
        # Float64 masters, so a float64 equivariance check sees exact transforms after .float().double().
        self.register_exact_buffer("fourier", torch.from_numpy(transform))
        self.register_exact_buffer("inverse_fourier", torch.from_numpy(inverse))
        irrep_entries = np.concatenate([rho.matrices.reshape(G, -1) for rho in group.irreps], axis=1)
        self.register_exact_buffer("irrep_matrices", torch.from_numpy(irrep_entries))
        if impl == "auto":
            impl = "fourier" if self.fourier_cost() < FOURIER_COST_RATIO * self.cayley_cost() else "cayley"
        self.impl = impl
        self._impl = {"fourier": _fourier_conv_forward, "windows": _windows_forward}.get(impl, _cayley_forward)

    def _init_fourier_basis(self, group: FiniteGroup) -> None:
        """The Schur plan on Fourier coefficients and the per-irrep coefficients ``K [|G|, p, p]``."""
        self.impl = "schur"
        self.in_type = RegularBasis(group, self.in_channels).ftype
        self.out_type = RegularBasis(group, self.out_channels).ftype
        self.plan: SlabPlan = slab_plan(self.in_type, self.out_type)
        coefficients, slabs = _conv_coefficients(group)
        for n, K in enumerate(coefficients):
            self.register_exact_buffer(f"conv_coef_{n}", torch.from_numpy(K))
        self._slab_blocks = [n for n, count in enumerate(slabs) for _ in range(count)]  # irrep block per slab
        self.bias_scale = RegularBasis(group, 1).trivial_scale()
        self._impl = _schur_forward

    def cayley_cost(self) -> int:
        """Multiply-adds per token of the dense form."""
        return self.order**2 * self.in_channels * self.out_channels

    def fourier_cost(self) -> int:
        """Multiply-adds per token of the Fourier form (transforms plus block products)."""
        dims = [rho.dim for rho in self.group.irreps]
        K = sum(d * d for d in dims)
        blocks = sum(d**3 for d in dims) * self.in_channels * self.out_channels
        return self.order * K * (self.in_channels + self.out_channels) + blocks

    def extra_repr(self) -> str:
        return (
            f"group_order={self.order}, in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"bias={self.bias is not None}, basis={self.basis!r}, impl={self.impl!r}"
        )

    def dense_weight(self) -> torch.Tensor:
        """The equivariant ``[|G| C_out, |G| C_in]`` matrix on frames: block (r, s) is ``W(R_r^-1 R_s)``."""
        return self.gather_dense()[0]

    def dense_weight_and_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(dense_weight(), dense_bias())`` on frames."""
        return self.gather_dense()

    def gather_dense(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The frame-basis ``(weight [|G| C_out, |G| C_in], bias [|G| C_out] or None)``, computed afresh."""
        G, O, I = self.order, self.out_channels, self.in_channels
        weight = self.weight[self.kernel_index].permute(0, 2, 1, 3).reshape(G * O, G * I)
        return weight, None if self.bias is None else self.bias.repeat(G)

    def dense_bias(self) -> torch.Tensor | None:
        """The bias ``[|G| C_out]``: the same ``[C_out]`` in every frame (``None`` without bias)."""
        return self.gather_dense()[1]

    def fourier_kernels(self) -> list[torch.Tensor]:
        """Per irrep rho, ``W_hat(rho)^T [d C_in, d C_out]`` (the frame-basis Fourier form).

        ``W_hat[(b', o), (b, i)] = sum_h rho(h)[b', b] W(h)[o, i]``.
        """
        O, I = self.out_channels, self.in_channels
        # All irreps in one GEMM: [K, G] @ [G, O I], K = sum d^2 entries (b', b) of the irreps.
        w_hat = torch.einsum("hk,hoi->koi", self.irrep_matrices, self.weight)
        kernels, row = [], 0
        for d in self.irrep_dims:
            block = w_hat[row : row + d * d].reshape(d, d, O, I).permute(1, 3, 0, 2)  # [b, i, b', o]
            kernels.append(block.reshape(d * I, d * O))
            row += d * d
        return kernels

    def slab_weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """``(matrices, biases)`` of the output slabs of :attr:`plan` (``basis="fourier"``): slab matrix
        ``sum_h K(h) (x) W(h)`` ``[p C_out, p C_in]``, the bias on the trivial slab only."""
        w, buffers = self.weight, self._buffers
        O, I = self.out_channels, self.in_channels
        mats = {}
        for n in set(self._slab_blocks):
            K = buffers[f"conv_coef_{n}"]
            p = K.shape[1]
            mats[n] = torch.einsum("hpq,hoi->poqi", K, w).reshape(p * O, p * I)
        biases: list[torch.Tensor | None] = [None] * len(self._slab_blocks)
        if self.bias is not None:
            biases[0] = self.bias * self.bias_scale
        return [mats[n] for n in self._slab_blocks], biases

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError unless ``x`` is ``[..., |G| * C_in]``."""
        if x.shape[-1] != self.order * self.in_channels:
            raise ValueError(f"expected regular features [..., {self.order} * {self.in_channels}], got {list(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return self._impl(self, x)

    def forward_windows(self, x: torch.Tensor) -> torch.Tensor:
        """The Cayley form with the input gathered instead of the weight: ``[..., |G|, |G| C_in]``
        windows ``[f(R_r u)]_u`` times the kernel ``[C_out, |G| C_in]``. It moves ``rows * |G|^2 C_in``
        numbers instead of the dense matrix's ``|G|^2 C_in C_out``, so it wins for few rows."""
        G, I = self.order, self.in_channels
        windows = x.unflatten(-1, (G, I)).index_select(-2, self.frame_windows)  # [..., G G, C_in]
        return F.linear(windows.reshape(*x.shape[:-1], G, G * I), self.kernel_matrix(), self.bias).flatten(-2)

    def kernel_matrix(self) -> torch.Tensor:
        """The kernel as one matrix ``[C_out, |G| C_in]``: column block u is ``W(u)``."""
        O, I = self.out_channels, self.in_channels
        return self.weight.transpose(0, 1).reshape(O, self.order * I)

    def forward_fourier(self, x: torch.Tensor) -> torch.Tensor:
        """The frame-basis Fourier form: ``f_hat(rho) = sum_g f(g) rho(g)``, ``y_hat = f_hat W_hat``, back."""
        return fourier_group_conv(
            x, self.fourier, self.inverse_fourier, self.fourier_kernels(), self.irrep_dims, self.bias
        )

    def fold(self) -> nn.Module:
        """The inference form: the slab matrices (Fourier basis), the per-irrep kernels (``impl="fourier"``) or
        the dense matrix fixed."""
        from eqvit.nn.folded import FoldedFourierConv, FoldedLinear, FoldedSchurLinear

        if self.basis == "fourier":
            return FoldedSchurLinear(self.plan, *self.slab_weights(), in_type=self.in_type, out_type=self.out_type)
        if self.impl == "fourier":
            return FoldedFourierConv(self)
        return FoldedLinear(*self.gather_dense(), in_type=self.in_type, out_type=self.out_type)


def _cayley_forward(m: GroupConvLinear, x: torch.Tensor) -> torch.Tensor:
    weight, bias = m.gather_dense()
    return F.linear(x, weight, bias)


def _windows_forward(m: GroupConvLinear, x: torch.Tensor) -> torch.Tensor:
    return m.forward_windows(x)


def _fourier_conv_forward(m: GroupConvLinear, x: torch.Tensor) -> torch.Tensor:
    return m.forward_fourier(x)


def _schur_forward(m: GroupConvLinear, x: torch.Tensor) -> torch.Tensor:
    return apply_slabs(x, m.plan, *m.slab_weights())


class RegularLayerNorm(nn.Module):
    """LayerNorm over all ``|G| * C`` entries of a token, affine ``[C]`` shared across frames.

    The mean and variance over every frame are invariant to permuting frames, and a per-channel
    scale that is the same in every frame commutes with that permutation. The affine parameters
    tiled over the frames are derived on every call (:meth:`fold` fixes them).
    """

    def __init__(self, group: FiniteGroup, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.order, self.channels, self.eps = group.order, channels, eps
        self.in_type = self.out_type = FeatureType.frames(group, channels)
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def tiled_affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight, bias)`` repeated over the frames, ``[|G| * C]`` each."""
        return self.weight.repeat(self.order), self.bias.repeat(self.order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.tiled_affine()
        return F.layer_norm(x, (self.order * self.channels,), weight, bias, self.eps)

    def fold(self) -> nn.Module:
        """The inference form: the tiled affine fixed."""
        from eqvit.nn.folded import FoldedLayerNorm

        return FoldedLayerNorm(*self.tiled_affine(), self.eps)


class FourierLayerNorm(IrrepLayerNorm):
    """:class:`RegularLayerNorm` on Fourier coefficients (:class:`RegularBasis`): the same function, the same
    parameters ``weight, bias [C]``.

    The mean over all frames and channels is the mean of the trivial coefficients (up to the transform's
    scale), and the transform is orthogonal, so centring and scale are :class:`~eqvit.nn.norm.IrrepLayerNorm`'s;
    coefficient ``s`` of channel ``c`` is scaled by ``weight[c]``, and the tiled bias lies on the trivial
    coefficients. ``[..., |G| C] -> [..., |G| C]``.
    """

    def __init__(self, basis: RegularBasis, eps: float = 1e-6) -> None:
        super().__init__(basis.ftype, eps=eps)
        self.order, self.channels = basis.group.order, basis.channels
        self.bias_scale = basis.trivial_scale()
        self.weight = nn.Parameter(torch.ones(self.channels))
        self.bias = nn.Parameter(torch.zeros(self.channels))

    def affine(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(gamma [dim], beta [dim], centre mask [dim])`` per coefficient."""
        beta = F.pad(self.bias * self.bias_scale, (0, (self.order - 1) * self.channels))
        return self.weight.repeat(self.order), beta, self.center_mask


class RegularLayerScale(nn.Module):
    """LayerScale with one gamma per channel, ``[C]``, shared by all frames.

    A gamma of shape ``[|G| * C]`` (one per frame and channel) would scale frames differently and
    break equivariance; ``tests/models/test_platonic.py`` checks that it does.
    """

    def __init__(self, group: FiniteGroup, channels: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.order = group.order
        self.in_type = self.out_type = FeatureType.frames(group, channels)
        self.gamma = nn.Parameter(torch.full((channels,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.unflatten(-1, (self.order, -1)) * self.gamma).flatten(-2)
