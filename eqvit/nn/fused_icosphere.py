"""The icosphere tokenizer's inference form, factored over a patch's 120-degree turns (C3).

A patch's three tokens are its kernel turned by 0, 120 and 240 degrees: the lifting reads the patch's
taps with the three turned kernels, the unpatchify writes them back. The taps fall into orbits of three
under the turn, and turn s meets member r of an orbit with the kernel's member r + s (mod 3). So per
orbit the dense map between three inputs and three outputs is a 3 x 3 block matrix whose block rows and
block columns all sum to the same block: block diagonal in the real Fourier basis of C3, with one block
on the orbit means and one on the two turning components (:func:`c3_factors`),

    mean:    [A, K]    on x0 + x1 + x2, giving z
    turning: [2A, 2K]  on (x0 - (x1 + x2) / 2 | x1 - x2), giving u, v

and the three outputs ``z + u | z + v | z - u - v``. The turning block commutes with the turn, which
acts on the turning components as a rotation by 120 degrees: it is a complex ``[A, K]`` matrix, and
Gauss's trick multiplies by it with three real products (:func:`c3_planes`). Four real ``[A, K]``
products in all: 4/9 of the dense product's multiply-adds (7.4M instead of 16.6M in each of SO3ViT's
lifting and unpatchify at width 128). The compiled passes of :mod:`eqvit.kernels.icosphere` run the changes
of basis and the four products tile by tile; where they cannot run (a GPU, gradients, bf16) the modules
keep the dense turned kernels of their base classes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from eqvit.kernels.icosphere import PLAN_KEYS, IcosphereC3Kernel, outside_kernels
from eqvit.nn.fused import FrozenIcosphereLift, FrozenIcosphereUnpatchify
from eqvit.nn.kept_calls import KeptKernelCalls, layout_of
from eqvit.nn.tokenizers.icosphere import IcospherePatchEmbed, IcosphereUnpatchify

# How the turn basis rebuilds the three members of an orbit and reads them (see icosphere_c3.cpp):
# member t = z + OUT_U[t] u + OUT_V[t] v; the turning inputs are sum_r IN_A[r] x_r and sum_r IN_B[r] x_r.
OUT_U, OUT_V = (1.0, 0.0, -1.0), (0.0, 1.0, -1.0)
IN_A, IN_B = (1.0, -0.5, -0.5), (0.0, 1.0, -1.0)


def tap_orbits(orientation_taps: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[O, 3]``: the orbits of a patch's taps under the turn, member r of each being the r-th turn of
    its first. ``orientation_taps [3, P]`` is the lifting's: turn s reads tap ``taps[s][q]`` where turn 0
    reads q."""
    if isinstance(orientation_taps, torch.Tensor):
        taps = orientation_taps.to(torch.int64)
    else:  # a copy: the lifting's arrays may be read-only
        taps = torch.tensor(orientation_taps, dtype=torch.int64)
    if taps.ndim != 2 or taps.shape[0] != 3:
        raise ValueError(f"expected orientation taps [3, P], got {list(taps.shape)}")
    turn = taps[1]
    identity = torch.arange(taps.shape[1])
    if not torch.equal(taps[0], identity) or not torch.equal(turn[turn], taps[2]):
        raise ValueError("the orientation taps are not the turns 0, 1, 2 of one permutation")
    if not torch.equal(turn[taps[2]], identity) or bool((turn == identity).any()):
        raise ValueError("the turn of the taps is not of order 3 without fixed taps: no orbits of three")
    orbits, seen = [], torch.zeros(taps.shape[1], dtype=torch.bool)
    for q in range(taps.shape[1]):
        if not seen[q]:
            orbit = [q, int(turn[q]), int(taps[2][q])]
            seen[orbit] = True
            orbits.append(orbit)
    return torch.tensor(orbits, dtype=torch.int64)


def c3_factors(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A map between the three members of an orbit, ``blocks [3 (out t), 3 (in r), A, K]``, as its mean
    block ``[A, K]`` and its turning block ``[2 A, 2 K]`` (rows u then v, columns the two turning inputs).

    Exact when every block row and block column sums to the same block (as the turned kernels' do);
    ValueError otherwise (the factors are checked to rebuild the blocks to round-off).
    """
    if blocks.ndim != 4 or blocks.shape[:2] != (3, 3):
        raise ValueError(f"expected blocks [3, 3, A, K], got {list(blocks.shape)}")
    blocks = blocks.to(torch.float64)
    mean = blocks[0].sum(0) / 3
    # member t's map after the mean, sum_r (blocks[t, r] - mean) x_r, sums to zero over r: it reads the
    # turning inputs only, x_a = x0 - (x1 + x2) / 2 and x_b = x1 - x2. Member 2 is then z - u - v.
    rest = blocks - mean
    turning = torch.cat(
        [torch.cat([rest[t, 0], rest[t, 1] + rest[t, 0] / 2], dim=1) for t in (0, 1)], dim=0
    )  # [2A, 2K]
    rebuilt = c3_dense(mean, turning)
    scale = blocks.abs().max().clamp_min(1e-300)
    if (rebuilt - blocks).abs().max() > 1e-12 * scale:
        raise ValueError("the blocks' rows and columns do not all sum alike: no factorisation over the turns")
    return mean, turning


def c3_dense(mean: torch.Tensor, turning: torch.Tensor) -> torch.Tensor:
    """The blocks ``[3, 3, A, K]`` that :func:`c3_factors` factors (its inverse)."""
    A, K = mean.shape
    u, v = turning[:A], turning[A:]
    blocks = []
    for t in range(3):
        uv = OUT_U[t] * u + OUT_V[t] * v  # [A, 2K]
        blocks.append([mean + IN_A[r] * uv[:, :K] + IN_B[r] * uv[:, K:] for r in range(3)])
    return torch.stack([torch.stack(row) for row in blocks])


HALF_ROOT3 = 3**0.5 / 2


def c3_planes(mean: torch.Tensor, turning: torch.Tensor) -> torch.Tensor:
    """The four weight planes ``[4, A, K]`` of :func:`c3_factors`' factors: the mean block, then the three
    real products that Gauss's trick multiplies the complex turning block with.

    With ``b' = sqrt(3)/2 (x1 - x2)``, ``a + i b'`` turns by 120 degrees under the turn, and so does the
    output's; the turning block commuting with that is the complex matrix ``P - i Q'``, where ``P`` and
    ``sqrt(3)/2 Q'`` are its top blocks (rows u). So, with the products ``y1 = P a``, ``y2 = Q' b'`` and
    ``y3 = (P + Q') (a - b')``: ``u = y1 + y2`` and ``v = -u / 2 + sqrt(3)/2 (y3 - y1 + y2)``
    (``icosphere_c3.cpp`` runs these passes). ValueError where the turning block is not of that form.
    """
    A, K = mean.shape
    if turning.shape != (2 * A, 2 * K):
        raise ValueError(
            f"expected a mean block [A, K] and a turning block [2A, 2K], got {list(mean.shape)}, {list(turning.shape)}"
        )
    turning = turning.to(torch.float64)
    P, Q = turning[:A, :K], turning[:A, K:]
    commuting = torch.cat([torch.cat([P, Q], 1), torch.cat([Q - P / 2, -0.75 * P - Q / 2], 1)], 0)
    if (commuting - turning).abs().max() > 1e-12 * turning.abs().max().clamp_min(1e-300):
        raise ValueError("the turning block does not commute with the turn: not a complex matrix on its turning parts")
    Q = Q / HALF_ROOT3
    return torch.stack([mean.to(torch.float64), P, Q, P + Q])


class _FactoredForward(KeptKernelCalls):
    """The forward of both factored forms: the call kept for the input's layout; else the one the subclass's
    ``bind(x)`` checks and returns (None where the passes cannot run), kept; else :meth:`dense_forward`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if outside_kernels(x):
            return self.dense_forward(x)
        layout = layout_of(x)
        call = self.kept_call(layout)
        if call is None:
            call = self.bind(x)
            if call is None:
                return self.dense_forward(x)
            self.keep_call(layout, call)
        return call(x)

    def dense_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The base class's dense form, where the passes cannot run."""
        return super().forward(x)


class C3IcosphereLift(_FactoredForward, FrozenIcosphereLift):
    """:class:`FrozenIcosphereLift` factored over the turns, on the compiled passes where they run:
    ``x [B, C, V] -> tokens [B, 3M, D]``."""

    def __init__(self, embed: IcospherePatchEmbed, kernel: IcosphereC3Kernel) -> None:
        super().__init__(embed)
        orbits = tap_orbits(embed.lifting.orientation_taps)
        M, P = embed.lifting.face_index.shape
        weight, bias = embed.turned_weights()  # [3 D, P C] rows (s, d), columns (q, c); bias [3 D]
        D, C = weight.shape[0] // 3, weight.shape[1] // P
        per_turn = weight.detach().to(torch.float64).view(3, D, P, C)[:, :, orbits]  # [3 s, D, O, 3 r, C]
        planes = c3_planes(*c3_factors(per_turn.permute(0, 3, 1, 2, 4).reshape(3, 3, D, -1)))  # [4, D, O C]
        bias = bias.detach().to(torch.float64).view(3, D)
        if not torch.equal(bias, bias[:1].expand(3, D)):
            raise ValueError("the three turned kernels of a lifting share one bias")
        self.register_exact_buffer("planes", kernel.pack_planes(planes))  # [4, D O C], see IcosphereC3Kernel
        self.register_exact_buffer("token_bias", bias[0])
        self.register_buffer("orbit_vertex", self.face_index.view(M, P)[:, orbits].contiguous(), persistent=False)
        self.kernel = kernel
        self.to(device=weight.device, dtype=weight.dtype)

    def bind(self, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if not self.kernel.supports(x, self.planes):
            return None
        return self.kernel.bind_lift(x, self.orbit_vertex, self.planes, self.token_bias)


class C3IcosphereUnpatchify(_FactoredForward, FrozenIcosphereUnpatchify):
    """:class:`FrozenIcosphereUnpatchify` factored over the turns, on the compiled passes where they run:
    ``tokens [B, 3M, D] -> [B, C_out, V]``.

    With ``norm`` (the model's final LayerNorm) it reads the tokens before that norm: its affine is folded
    into the weight planes and the bias, and the pass that reads the tokens normalises each of them; the
    dense form applies ``norm`` first.
    """

    def __init__(self, head: IcosphereUnpatchify, kernel: IcosphereC3Kernel, norm: nn.LayerNorm | None = None) -> None:
        super().__init__(head)
        orbits = tap_orbits(head.lifting.orientation_taps)
        face_index = torch.from_numpy(head.lifting.face_index.copy())  # [M, P]
        P, O = face_index.shape[1], orbits.shape[0]
        weight, bias = head.turned_weights()  # [C P, 3 D] rows (c, q), columns (s, d); bias [C P]
        C, D = weight.shape[0] // P, weight.shape[1] // 3
        per_tap = weight.detach().to(torch.float64).view(C, P, 3, D)[:, orbits]  # [C, O, 3 r, 3 s, D]
        planes = c3_planes(*c3_factors(per_tap.permute(2, 3, 1, 0, 4).reshape(3, 3, O * C, D)))  # [4, O C, D]
        # Every tap receives the bias of its whole orbit (the three turns'): summed here in float64.
        orbit_bias = head.proj.bias.detach().to(torch.float64).view(C, P)[:, orbits].sum(-1)  # [C, O]
        expected = orbit_bias[:, torch.argsort(orbits.reshape(-1)) // 3]  # [C, P], tap q's orbit
        if not torch.allclose(bias.detach().to(torch.float64).view(C, P), expected, rtol=1e-5, atol=1e-6):
            raise ValueError("the summed bias of an unpatchify is not its orbit's: the taps' turns are not C3")
        orbit_bias = orbit_bias.t().reshape(O * C)
        self.norm_eps, self.norm = None, nn.Identity()
        if norm is not None:
            planes, orbit_bias = _fold_layer_norm(norm, planes, orbit_bias)
            self.norm_eps, self.norm = float(norm.eps), copy.deepcopy(norm).requires_grad_(False)
        self.register_exact_buffer("planes", kernel.pack_planes(planes))  # [4, O C D], see IcosphereC3Kernel
        self.register_exact_buffer("orbit_bias", orbit_bias)
        for name, value in _scatter_plan(face_index[:, orbits], C, head.num_vertices).items():
            self.register_buffer(f"scatter_{name}", value, persistent=False)
        self.kernel = kernel
        self.to(device=weight.device, dtype=weight.dtype)

    def dense_forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().dense_forward(self.norm(tokens))

    def bind(self, tokens: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if not (self.kernel.supports(tokens, self.planes) and tokens.is_contiguous()):
            return None
        plan = {name: getattr(self, f"scatter_{name}") for name in PLAN_KEYS}
        return self.kernel.bind_unpatchify(tokens, plan, self.planes, self.orbit_bias, self.inv_count, self.norm_eps)


def _fold_layer_norm(norm: nn.LayerNorm, planes: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The planes ``[4, A, D]`` and bias ``[A]`` of an unpatchify that reads LayerNorm'd tokens, for tokens
    normalised without the affine: the scale multiplies every plane's columns; the shift survives in the mean
    plane only, once per member of an orbit (the turning inputs subtract it away)."""
    D = planes.shape[-1]
    if tuple(norm.normalized_shape) != (D,):
        raise ValueError(f"expected a LayerNorm over the tokens' {D} channels, got {tuple(norm.normalized_shape)}")
    weight = torch.ones(D, dtype=torch.float64) if norm.weight is None else norm.weight.detach().to(torch.float64)
    shift = torch.zeros(D, dtype=torch.float64) if norm.bias is None else norm.bias.detach().to(torch.float64)
    return planes * weight, bias + 3 * planes[0] @ shift


def _scatter_plan(orbit_vertex: torch.Tensor, channels: int, V: int) -> dict[str, torch.Tensor]:
    """Who writes on each vertex, for the gather-form scatter of ``icosphere_c3.cpp``.

    ``orbit_vertex [M, O, 3]``: the vertex of member r of orbit o of patch m. Entry (m, o, r) reads the
    products' values of patch m (``patch``) in rows ``row = o C`` .. ``o C + C - 1``; vertices are visited by
    their first entry, so that the reads run nearly in sequence.
    """
    O = orbit_vertex.shape[1]
    flat = orbit_vertex.reshape(-1)
    entry = torch.arange(flat.numel())
    first = torch.full((V,), flat.numel(), dtype=torch.int64).scatter_reduce(0, flat, entry, "amin")
    vertex = torch.argsort(first, stable=True)
    rank = torch.empty(V, dtype=torch.int64)
    rank[vertex] = torch.arange(V)
    order = torch.argsort(rank[flat], stable=True)  # entries grouped by vertex, in entry order within one
    orbit, turn = order // 3, order % 3
    ptr = torch.zeros(V + 1, dtype=torch.int64)
    ptr[1:] = torch.bincount(rank[flat], minlength=V).cumsum(0)
    return {
        "vertex": vertex.to(torch.int32),
        "ptr": ptr.to(torch.int32),
        "patch": (orbit // O).to(torch.int32),
        "row": (orbit % O * channels).to(torch.int32),
        "turn": turn.to(torch.uint8),
    }
