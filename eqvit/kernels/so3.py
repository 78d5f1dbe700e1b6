"""SO(3)-RoPE's per-token block-diagonal rotation as a compiled CPU kernel (``so3_rotate.cpp``)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from eqvit.kernels import CompiledKernel

__all__ = ["SO3RotationKernel", "pack_wigner_blocks"]

_LONG = ctypes.c_long
_PTR = ctypes.c_void_p


def pack_wigner_blocks(pi: torch.Tensor, max_order: int) -> torch.Tensor:
    """``pi [N, (L+1)^2, (L+1)^2]`` (block diagonal) -> its blocks D^1 .. D^L row-major, ``[N, sum (2l+1)^2]``.

    D^0 = 1 is dropped: the kernel leaves channel 0 as it is.
    """
    orders = [slice(l * l, (l + 1) ** 2) for l in range(1, max_order + 1)]
    blocks = [pi[:, s, s].reshape(pi.shape[0], -1) for s in orders]
    return torch.cat(blocks, dim=1).contiguous() if blocks else pi.new_zeros(pi.shape[0], 0)


class SO3RotationKernel(CompiledKernel):
    """The compiled rotation, bound once; ``None`` from :meth:`load` where it cannot be built.

    ``rotate_(rows, blocks, L)``: in place on ``rows [B, N, R, >= (L+1)^2]`` (channel stride 1, CPU,
    float32 or float64 like ``blocks [N, sum (2l+1)^2]`` from :func:`pack_wigner_blocks`): every row's
    channels ``l^2 .. l^2 + 2l`` are multiplied by its token's D^l, for l = 1..L.
    """

    library = "so3_rotate"
    dtypes = (torch.float32, torch.float64)

    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.eqvit_so3_rotate_max_order.restype = _LONG
        self.max_order = int(lib.eqvit_so3_rotate_max_order())
        self._fns = {torch.float32: lib.eqvit_so3_rotate_f32, torch.float64: lib.eqvit_so3_rotate_f64}
        for fn in self._fns.values():
            fn.argtypes = [_PTR, _LONG, _LONG, _LONG, _LONG, _LONG, _LONG, _PTR, _LONG, ctypes.c_int]
            fn.restype = None

    def supports(self, rows: torch.Tensor, blocks: torch.Tensor) -> bool:
        """Whether :meth:`rotate_` can run on these tensors (else use the PyTorch form)."""
        return (
            rows.device.type == "cpu"
            and rows.dtype in self.dtypes
            and blocks.dtype == rows.dtype
            and blocks.device.type == "cpu"
            and blocks.is_contiguous()
            and rows.ndim == 4
            and rows.stride(-1) == 1
            and not rows.requires_grad  # ctypes writes are invisible to autograd
        )

    def rotate_(self, rows: torch.Tensor, blocks: torch.Tensor, max_order: int) -> torch.Tensor:
        self.bind(rows, blocks, max_order)(rows.data_ptr())
        return rows

    def bind(self, rows: torch.Tensor, blocks: torch.Tensor, max_order: int) -> Callable[[int], None]:
        """:meth:`rotate_` checked once for every tensor laid out like ``rows``: ``rotate(data_ptr)`` rotates
        the rows of the same shape, strides and dtype that start at ``data_ptr`` (the caller vouches for that
        layout), with ``blocks`` bound (held, so they live as long as ``rotate``)."""
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
        if (max_order + 1) ** 2 > D or blocks.shape != (N, per_token):
            raise ValueError(
                f"expected blocks [{N}, {per_token}] for {N} tokens at order {max_order} and rows of >= "
                f"{(max_order + 1) ** 2} channels; got blocks {list(blocks.shape)}, rows {list(rows.shape)}"
            )
        sb, sn, sr, _ = rows.stride()
        fn = self._fns[rows.dtype]

        def rotate(data_ptr: int) -> None:
            # tokens split over torch's intra-op thread count, read now: set_num_threads may have changed it
            fn(data_ptr, B, N, R, sb, sn, sr, blocks.data_ptr(), max_order, torch.get_num_threads())

        return rotate
