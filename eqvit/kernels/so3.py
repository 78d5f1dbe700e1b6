"""SO(3)-RoPE's per-token block-diagonal rotation as a compiled CPU kernel (``so3_rotate.cpp``)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from eqvit.kernels import CompiledKernel

__all__ = ["SO3RotationKernel", "pack_wigner_blocks", "turned_wigner_blocks", "z_turn_matrices"]

_LONG = ctypes.c_long
_PTR = ctypes.c_void_p


def pack_wigner_blocks(pi: torch.Tensor, max_order: int) -> torch.Tensor:
    """``pi [N, (L+1)^2, (L+1)^2]`` (block diagonal) -> its blocks D^1 .. D^L row-major, ``[N, sum (2l+1)^2]``.

    D^0 = 1 is dropped: the kernel leaves channel 0 as it is.
    """
    orders = [slice(l * l, (l + 1) ** 2) for l in range(1, max_order + 1)]
    blocks = [pi[:, s, s].reshape(pi.shape[0], -1) for s in orders]
    return torch.cat(blocks, dim=1).contiguous() if blocks else pi.new_zeros(pi.shape[0], 0)


def _is_z_turn(first_order: torch.Tensor, atol: float) -> torch.Tensor:
    """``[...]`` bool: whether D^1 blocks ``[..., 3, 3]`` (real basis m = -1, 0, 1) turn about the z-axis only."""
    fixed = first_order[..., 1, :].clone()
    fixed[..., 1] -= 1
    moved = first_order[..., [0, 2], 1]
    return (fixed.abs().amax(-1) <= atol) & (moved.abs().amax(-1) <= atol)


def turned_wigner_blocks(
    pi: torch.Tensor, max_order: int, atol: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``pi [N, (L+1)^2, (L+1)^2]`` as groups of G >= 2 consecutive tokens whose poses differ by turns about
    their z-axis: ``pi[n] = pi[g G] Z(t_n)`` for token n of group g (the icosphere's three tokens per patch).

    Returns the groups' blocks ``[N / G, sum (2l+1)^2]`` (:func:`pack_wigner_blocks`) and the tokens' turns
    ``[N, 2 L]``: ``(cos m t_n, sin m t_n)`` for m = 1..L, where ``Z`` maps channels (-m, +m) of every order to
    ``(c x_-m - s x_+m, s x_-m + c x_+m)``; or None where the tokens do not group so (within ``atol``).
    """
    N, L = pi.shape[0], max_order
    if L < 1 or N < 2:
        return None
    pi = pi.to(torch.float64)
    first = pi[:, 1:4, 1:4]
    same_axis = _is_z_turn(first[:-1].transpose(1, 2) @ first[1:], atol)  # token n + 1 against token n
    starts = [0, *(n + 1 for n in range(N - 1) if not same_axis[n])]
    G = N // len(starts)
    if G < 2 or starts != list(range(0, N, G)):
        return None
    base = pi[::G]
    turn = base.repeat_interleave(G, dim=0).transpose(1, 2) @ pi  # Z(t_n) = pi[g G]^T pi[n]
    centre = [m * m + m for m in range(1, L + 1)]  # channel m = 0 of order l = m
    cos = torch.stack([turn[:, c - m, c - m] for m, c in enumerate(centre, 1)], dim=1)
    sin = torch.stack([turn[:, c + m, c - m] for m, c in enumerate(centre, 1)], dim=1)
    turns = torch.stack([cos, sin], dim=-1).reshape(N, 2 * L).contiguous()
    if (z_turn_matrices(turns, L) - turn).abs().max() > atol:
        return None
    return pack_wigner_blocks(base, L), turns


def z_turn_matrices(turns: torch.Tensor, max_order: int) -> torch.Tensor:
    """The matrices Z ``[N, (L+1)^2, (L+1)^2]`` that the kernel applies for ``turns [N, 2 L]`` (token n's
    ``(cos m t, sin m t)`` for m = 1..L): on every order l, channels (-m, +m) to
    ``(c x_-m - s x_+m, s x_-m + c x_+m)``; channel m = 0 stays."""
    L = max_order
    cos, sin = turns.view(-1, L, 2).unbind(-1)
    Z = torch.eye((L + 1) ** 2, dtype=turns.dtype).repeat(turns.shape[0], 1, 1)
    for l in range(1, L + 1):
        c = l * l + l
        for m in range(1, l + 1):
            Z[:, c - m, c - m] = Z[:, c + m, c + m] = cos[:, m - 1]
            Z[:, c - m, c + m], Z[:, c + m, c - m] = -sin[:, m - 1], sin[:, m - 1]
    return Z


class SO3RotationKernel(CompiledKernel):
    """The compiled rotation, bound once; ``None`` from :meth:`load` where it cannot be built.

    ``rotate_(rows, blocks, L)``: in place on ``rows [B, N, R, >= (L+1)^2]`` (channel stride 1, CPU,
    float32 or float64 like ``blocks [N, sum (2l+1)^2]`` from :func:`pack_wigner_blocks`): every row's
    channels ``l^2 .. l^2 + 2l`` are multiplied by its token's D^l, for l = 1..L. With ``turns`` (the turned
    form, :func:`turned_wigner_blocks`) ``blocks`` holds one set per group of tokens, each turned per token.
    """

    library = "so3_rotate"

    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.eqvit_so3_rotate_max_order.restype = _LONG
        self.max_order = int(lib.eqvit_so3_rotate_max_order())
        self._fns = {torch.float32: lib.eqvit_so3_rotate_f32, torch.float64: lib.eqvit_so3_rotate_f64}
        for fn in self._fns.values():
            fn.argtypes = [_PTR, _LONG, _LONG, _LONG, _LONG, _LONG, _LONG, _PTR, _PTR, _LONG, _LONG, ctypes.c_int]
            fn.restype = None

    def supports(self, rows: torch.Tensor, blocks: torch.Tensor) -> bool:
        """Whether :meth:`rotate_` can run on these tensors (else use the PyTorch form)."""
        return super().supports(rows, blocks) and blocks.is_contiguous() and rows.ndim == 4 and rows.stride(-1) == 1

    def rotate_(
        self, rows: torch.Tensor, blocks: torch.Tensor, max_order: int, turns: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.bind(rows, blocks, max_order, turns)(rows.data_ptr())
        return rows

    def bind(
        self, rows: torch.Tensor, blocks: torch.Tensor, max_order: int, turns: torch.Tensor | None = None
    ) -> Callable[[int], None]:
        """:meth:`rotate_` checked once for every tensor laid out like ``rows``: ``rotate(data_ptr)`` rotates
        the rows of the same shape, strides and dtype that start at ``data_ptr`` (the caller vouches for that
        layout), with ``blocks`` (and ``turns``) bound (held, so they live as long as ``rotate``)."""
        if not self.supports(rows, blocks):
            raise ValueError(
                f"the SO(3) rotation kernel needs CPU float32/float64 rows [B, N, R, D] with channel stride 1, not "
                f"requiring grad, and contiguous blocks of the same dtype; got rows {list(rows.shape)} "
                f"{rows.dtype} on {rows.device} (strides {rows.stride()}, requires_grad={rows.requires_grad}), "
                f"blocks {list(blocks.shape)} {blocks.dtype} on {blocks.device}"
            )
        if not 0 <= max_order <= self.max_order:
            raise ValueError(f"the kernel rotates orders up to {self.max_order}, got max_order {max_order}")
        B, N, R, D = rows.shape
        per_token = sum((2 * l + 1) ** 2 for l in range(1, max_order + 1))
        groups = N if turns is None else blocks.shape[0]
        if (max_order + 1) ** 2 > D or blocks.shape != (groups, per_token) or groups < 1 or N % groups:
            raise ValueError(
                f"expected blocks [{N}, {per_token}] (or one set per group of tokens, with turns) for {N} tokens "
                f"at order {max_order} and rows of >= {(max_order + 1) ** 2} channels; got blocks "
                f"{list(blocks.shape)}, rows {list(rows.shape)}"
            )
        sb, sn, sr, _ = rows.stride()
        if turns is not None and not (self.supports(rows, turns) and turns.shape == (N, 2 * max_order)):
            raise ValueError(
                f"expected contiguous turns [{N}, {2 * max_order}] of the rows' dtype, got {list(turns.shape)} "
                f"{turns.dtype} on {turns.device}"
            )
        fn, group = self._fns[rows.dtype], N // groups
        turns_ptr = None if turns is None else turns.data_ptr()  # None: the per-token form (group 1)

        def rotate(data_ptr: int) -> None:
            # tokens split over torch's intra-op thread count, read now: set_num_threads may have changed it
            fn(data_ptr, B, N, R, sb, sn, sr, blocks.data_ptr(), turns_ptr, group, max_order, torch.get_num_threads())

        rotate.turns = turns  # the turns must outlive the call that holds their pointer
        return rotate
