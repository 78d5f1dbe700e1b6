"""SO(3)-RoPE's inference form: the fixed-pose rotation on the compiled CPU kernel.

The training form rotates queries and keys with one batched matmul per sample over the tokens'
dense ``24 x 24`` matrices (at L = 4) and writes the result back. Block by block (D^1 .. D^L) the
same rotation is 164 instead of 576 products per row, and the kernel (:mod:`eqvit.kernels.so3`) does
it in place with the heads of a token in the vector lanes: 2.4x faster than the matmul in the
shallow-water SO3ViT (0.90 against 2.16 ms for its four blocks at batch 1, one thread;
``benchmarks/so3vit_vs_s2transformer.py --profile``).
"""

from __future__ import annotations

import torch

from eqvit.kernels.so3 import SO3RotationKernel, pack_wigner_blocks, turned_wigner_blocks
from eqvit.nn.kept_calls import KeptKernelCalls, layout_of
from eqvit.nn.posenc.so3rope import SO3RoPE


class KernelSO3RoPE(KeptKernelCalls, SO3RoPE):
    """An :class:`SO3RoPE` with fixed poses whose in-place rotation (``rotate_qk_stacked_``) runs ``kernel``.

    The kernel takes CPU float32 / float64 tensors outside autograd; anything else (a GPU, autocast's
    bf16, gradients through a fused model) takes the matmul of :class:`SO3RoPE`, which computes the
    same rotation. The checks run once per layout of ``qk`` (:mod:`eqvit.nn.kept_calls`): at batch 1 ten
    Python-level checks cost about as much as the 0.09 ms rotation, four times a forward.

    Where the poses come in groups that differ by turns about their z-axis (SO3ViT's three tokens per
    icosphere patch; :func:`~eqvit.kernels.so3.turned_wigner_blocks`), ``wigner_blocks`` holds one set per
    group and ``turns`` each token's turn (``group`` > 1): a third of the blocks to read per rotation.
    """

    def __init__(self, rope: SO3RoPE, kernel: SO3RotationKernel) -> None:
        if rope.pi is None:
            raise ValueError("KernelSO3RoPE needs an SO3RoPE built with fixed poses")
        if rope.max_order > kernel.max_order:
            raise ValueError(f"the kernel rotates orders up to {kernel.max_order}, the scheme has {rope.max_order}")
        pi = rope.exact_buffer("pi")
        super().__init__(rope.head_dim, max_order=rope.max_order, wigner=pi)
        turned = turned_wigner_blocks(pi, rope.max_order)
        if turned is None:
            self.turns = None
            self.register_exact_buffer("wigner_blocks", pack_wigner_blocks(pi, rope.max_order))
        else:
            blocks, turns = turned
            self.register_exact_buffer("wigner_blocks", blocks)
            self.register_exact_buffer("turns", turns)
        self.kernel = kernel
        self.to(device=rope.pi.device, dtype=rope.pi.dtype)

    @property
    def group(self) -> int:
        """Tokens per set of Wigner blocks: 1 in the per-token form, G in the turned form."""
        return self.pi.shape[0] // self.wigner_blocks.shape[0]

    def rotate_qk_stacked_(self, qk: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
        """In place on ``qk [B, N, 2, H, D]``, as :meth:`SO3RoPE.rotate_qk_stacked_`."""
        layout = layout_of(qk, num_prefix_tokens)
        kept = None if qk.requires_grad else self.kept_call(layout)
        if kept is None:
            return self._rotate_and_keep(qk, num_prefix_tokens, layout)
        rotate, offset = kept
        rotate(qk.data_ptr() + offset)
        return qk

    def _rotate_and_keep(self, qk: torch.Tensor, num_prefix_tokens: int, layout: tuple) -> torch.Tensor:
        """:class:`SO3RoPE`'s checks, then the kernel (its call kept for ``layout``) or, outside the kernel's
        domain, the matmul."""
        self._check_fixed(qk, num_prefix_tokens, token_axis=1)
        rows = self._rows(qk, num_prefix_tokens)
        if not self.kernel.supports(rows, self.wigner_blocks):
            self._rotate_rows_(rows)
            return qk
        rotate = self.kernel.bind(rows, self.wigner_blocks, self.max_order, self.turns)
        self.keep_call(layout, (rotate, rows.data_ptr() - qk.data_ptr()))
        rotate(rows.data_ptr())
        return qk
