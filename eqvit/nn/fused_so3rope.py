"""SO(3)-RoPE's inference form: the fixed-pose rotation on the compiled CPU kernel.

The training form rotates queries and keys with one batched matmul per sample over the tokens'
dense ``24 x 24`` matrices (at L = 4) and writes the result back. Block by block (D^1 .. D^L) the
same rotation is 164 instead of 576 products per row, and the kernel (:mod:`eqvit.kernels.so3`) does
it in place with the heads of a token in the vector lanes: 2.4x faster than the matmul in the
shallow-water SO3ViT (0.90 against 2.16 ms for its four blocks at batch 1, one thread;
``benchmarks/so3vit_vs_s2transformer.py --profile``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from eqvit.kernels.so3 import SO3RotationKernel, pack_wigner_blocks
from eqvit.nn.posenc.so3rope import SO3RoPE


class KernelSO3RoPE(SO3RoPE):
    """An :class:`SO3RoPE` with fixed poses whose in-place rotation (``rotate_qk_stacked_``) runs ``kernel``.

    The kernel takes CPU float32 / float64 tensors outside autograd; anything else (a GPU, autocast's
    bf16, gradients through a fused model) takes the matmul of :class:`SO3RoPE`, which computes the
    same rotation.

    The checks run once per layout of ``qk`` (shape, strides, dtype, device, prefix tokens): the kernel
    call they validate is kept (:meth:`SO3RotationKernel.bind`) and a layout seen before goes straight to
    it. The checks cost as much as the rotation itself at batch 1 (ten Python-level checks against a
    0.09 ms kernel, four times a forward), so they are paid once. Moving or casting the module, or
    assigning a tensor to it, drops the kept calls.
    """

    def __init__(self, rope: SO3RoPE, kernel: SO3RotationKernel) -> None:
        if rope.pi is None:
            raise ValueError("KernelSO3RoPE needs an SO3RoPE built with fixed poses")
        if rope.max_order > kernel.max_order:
            raise ValueError(f"the kernel rotates orders up to {kernel.max_order}, the scheme has {rope.max_order}")
        pi = rope.exact_buffer("pi")
        super().__init__(rope.head_dim, max_order=rope.max_order, wigner=pi)
        self._bound: dict[tuple, tuple[Callable[[int], None], int]] = {}
        self.register_exact_buffer("wigner_blocks", pack_wigner_blocks(pi, rope.max_order))
        self.kernel = kernel
        self.to(device=rope.pi.device, dtype=rope.pi.dtype)

    def rotate_qk_stacked_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        """In place on ``qk [B, N, 2, H, D]``, as :meth:`SO3RoPE.rotate_qk_stacked_`."""
        layout = (qk.shape, qk.stride(), qk.dtype, qk.device, num_prefix_tokens)
        bound = None if qk.requires_grad else self._bound.get(layout)
        if bound is None:
            return self._rotate_and_bind(qk, num_prefix_tokens, layout)
        rotate, offset = bound
        rotate(qk.data_ptr() + offset)
        return qk

    def _rotate_and_bind(self, qk: torch.Tensor, num_prefix_tokens: int, layout: tuple) -> torch.Tensor:
        """The checked path of :class:`SO3RoPE`; where it ran the kernel, the call is kept for ``layout``."""
        super().rotate_qk_stacked_(qk, num_prefix_tokens)
        rows = self._rows(qk, num_prefix_tokens)
        if self.kernel.supports(rows, self.wigner_blocks):
            rotate = self.kernel.bind(rows, self.wigner_blocks, self.max_order)
            self._bound[layout] = (rotate, rows.data_ptr() - qk.data_ptr())
        return qk

    def _rotate_rows_(self, rows: torch.Tensor) -> None:
        if self.kernel.supports(rows, self.wigner_blocks):
            self.kernel.rotate_(rows, self.wigner_blocks, self.max_order)
        else:
            super()._rotate_rows_(rows)

    # The kept calls hold data pointers of this module's tensors: whatever replaces a tensor drops them.
    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, torch.Tensor) and "_bound" in self.__dict__:
            self._bound.clear()
        super().__setattr__(name, value)

    def _apply(self, fn, recurse: bool = True):
        self._bound.clear()
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        # a copy or a pickle binds its own calls (to its own tensors)
        return {**super().__getstate__(), "_bound": {}}
