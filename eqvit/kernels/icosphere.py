"""The icosphere tokenizer's lifting and unpatchify in the basis of a patch's turns (``icosphere_c3.cpp``).

:mod:`eqvit.nn.fused_icosphere` factors the lifting and the unpatchify over the patch's 120-degree turns
into four weight planes; this module binds the compiled passes that run the change into the turn basis, the
four products and the change out of it tile by tile, once per input layout.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from eqvit.kernels import CompiledKernel

__all__ = ["IcosphereC3Kernel", "outside_kernels"]

_LONG, _INT, _PTR = ctypes.c_long, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "lift": [_PTR, _LONG, _LONG, _LONG, _LONG, _LONG, _PTR, _LONG, _LONG, _PTR, _PTR, _LONG, _PTR, _INT],
    "unpatchify": [_PTR, _LONG, _LONG, _LONG, _LONG, _INT, ctypes.c_double, _PTR, _PTR, _LONG, _LONG]
    + [_PTR] * 5
    + [_PTR, _LONG, _PTR, _INT],
}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
PLAN_KEYS = ("vertex", "ptr", "patch", "row", "turn")  # the scatter plan's tensors, see icosphere_c3.cpp


def outside_kernels(x: torch.Tensor) -> bool:
    """Whether a forward on ``x`` must keep to PyTorch's operators: under autograd (ctypes writes are invisible
    to it) or CPU autocast (the product between the passes would hand them bf16 tensors)."""
    return x.requires_grad or torch.is_autocast_enabled("cpu")


class IcosphereC3Kernel(CompiledKernel):
    """The compiled passes, bound once; ``None`` from :meth:`load` where they cannot be built.

    :meth:`bind_lift` and :meth:`bind_unpatchify` check a layout and the factored weights once and return
    the forward for inputs of that layout (the caller keeps it per layout).
    """

    library = "icosphere_c3"

    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.eqvit_c3_max_channels.restype = lib.eqvit_c3_row_block.restype = _LONG
        self.max_channels = int(lib.eqvit_c3_max_channels())
        self.row_block = int(lib.eqvit_c3_row_block())
        self._fns: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}
        for name, argtypes in _SIGNATURES.items():
            for dtype, suffix in _SUFFIX.items():
                fn = getattr(lib, f"eqvit_c3_{name}_{suffix}")
                fn.argtypes, fn.restype = argtypes, None
                self._fns[name, dtype] = fn

    def supports(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether the passes can run on ``x`` with factored weights like ``weight`` (else the dense form)."""
        return super().supports(x, weight) and not outside_kernels(x)

    def pack_planes(self, planes: torch.Tensor) -> torch.Tensor:
        """Weight planes ``[4, J, K]`` in the passes' storage ``[4, J K]``: blocks of :attr:`row_block` rows (the
        last may be shorter), each stored k-major (``[K, rows]``), so that a product reads a block in sequence."""
        if planes.ndim != 3 or planes.shape[0] != 4:
            raise ValueError(f"expected weight planes [4, J, K], got {list(planes.shape)}")
        J, block = planes.shape[1], self.row_block
        blocks = [planes[:, j : j + block].transpose(1, 2).reshape(4, -1) for j in range(0, J, block)]
        return torch.cat(blocks, dim=1).contiguous()

    def bind_lift(
        self, x: torch.Tensor, orbit_vertex: torch.Tensor, planes: torch.Tensor, bias: torch.Tensor
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The lifting for inputs laid out like ``x [B, C, V]``: ``tokens [B, 3 M, D] = lift(x)``.

        ``orbit_vertex [M, O, 3]``: the vertices of each patch's tap orbits (member r of orbit o);
        ``planes [4, D O C]``: the four weight planes ``[D, O C]`` (:func:`~eqvit.nn.fused_icosphere.c3_planes`)
        as :meth:`pack_planes` stores them; ``bias [D]``: the tokens' bias.
        """
        if x.ndim != 3 or orbit_vertex.ndim != 3 or orbit_vertex.shape[2] != 3:
            raise ValueError(
                f"expected x [B, C, V] and orbit vertices [M, O, 3]; got x {list(x.shape)}, "
                f"orbit vertices {list(orbit_vertex.shape)}"
            )
        B, C, V = x.shape
        M, O, _ = orbit_vertex.shape
        D = bias.shape[0] if bias.ndim == 1 else 0
        self._check(x, planes, bias)
        _check_planes(planes, bias, D * O * C, D)
        _check_index(orbit_vertex, V, "orbit vertex")
        sxb, sxc, sxv = x.stride()
        run, dtype = self._fns["lift", x.dtype], x.dtype

        def lift(x: torch.Tensor) -> torch.Tensor:
            out = torch.empty(B, 3 * M, D, dtype=dtype)
            weights = (orbit_vertex.data_ptr(), M, O, planes.data_ptr(), bias.data_ptr(), D)
            run(x.data_ptr(), B, C, sxb, sxc, sxv, *weights, out.data_ptr(), torch.get_num_threads())
            return out

        return lift

    def bind_unpatchify(
        self,
        tokens: torch.Tensor,
        scatter_plan: dict[str, torch.Tensor],
        planes: torch.Tensor,
        bias: torch.Tensor,
        inv_count: torch.Tensor,
        norm_eps: float | None = None,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The unpatchify for tokens laid out like ``tokens [B, 3 M, D]`` (contiguous): ``[B, C, V]``.

        ``planes [4, O C D]``: the four weight planes ``[O C, D]`` (rows (o, c)) as :meth:`pack_planes` stores
        them; ``bias [O C]``: the orbit values' bias; ``scatter_plan``: ``vertex``, ``ptr``, ``patch``, ``row``
        (int32) and ``turn`` (uint8), see ``icosphere_c3.cpp``; ``inv_count [V]``: 1 / (what each vertex
        receives). With ``norm_eps`` each
        token is first normalised over its D channels, a LayerNorm whose affine the planes and bias hold.
        """
        B, N, D = tokens.shape
        M, V = N // 3, inv_count.shape[0]
        OC = bias.shape[0] if bias.ndim == 1 else 0
        self._check(tokens, planes, bias, inv_count)
        if not tokens.is_contiguous() or N % 3:
            raise ValueError(
                f"expected contiguous tokens [B, 3 M, D]; got tokens {list(tokens.shape)} "
                f"(contiguous: {tokens.is_contiguous()})"
            )
        _check_planes(planes, bias, OC * D, OC)
        C = _check_scatter_plan(scatter_plan, M, OC, V)
        if C > self.max_channels:
            raise ValueError(f"the kernel scatters at most {self.max_channels} channels, got {C}")
        plan = [scatter_plan[key].data_ptr() for key in PLAN_KEYS]
        run, dtype = self._fns["unpatchify", tokens.dtype], tokens.dtype
        normalize, eps = norm_eps is not None, 0.0 if norm_eps is None else norm_eps

        def unpatchify(tokens: torch.Tensor) -> torch.Tensor:
            out = torch.empty(B, C, V, dtype=dtype)
            weights = (planes.data_ptr(), bias.data_ptr(), OC, C, *plan, inv_count.data_ptr(), V)
            run(tokens.data_ptr(), B, M, D, 3 * D, normalize, eps, *weights, out.data_ptr(), torch.get_num_threads())
            return out

        # the plan's tensors must outlive the call that holds their pointers
        unpatchify.scatter_plan = scatter_plan
        return unpatchify

    def _check(self, x: torch.Tensor, *weights: torch.Tensor) -> None:
        if not all(self.supports(x, w) and w.is_contiguous() for w in weights):
            raise ValueError(
                f"the icosphere C3 kernel needs a CPU float32/float64 input not requiring grad and contiguous "
                f"weights of its dtype; got {list(x.shape)} {x.dtype} on {x.device} "
                f"(requires_grad={x.requires_grad}), weights {[(w.dtype, w.device.type) for w in weights]}"
            )


def _check_planes(planes: torch.Tensor, bias: torch.Tensor, size: int, outputs: int) -> None:
    """Four packed weight planes ``[4, size]`` and a bias ``[outputs]`` (``outputs`` > 0 rows of the planes)."""
    if outputs == 0 or planes.shape != (4, size) or bias.shape != (outputs,):
        raise ValueError(
            f"expected packed weight planes [4, {size}] and bias [{outputs}]; got {list(planes.shape)} and "
            f"{list(bias.shape)}"
        )


def _check_index(index: torch.Tensor, bound: int, what: str) -> None:
    """The compiled loops trust their indices: check them once, where they are bound."""
    if index.dtype != torch.int64 or not index.is_contiguous() or index.numel() == 0:
        raise ValueError(f"expected a contiguous int64 {what} index, got {index.dtype} {list(index.shape)}")
    if int(index.min()) < 0 or int(index.max()) >= bound:
        raise ValueError(f"{what} index out of range [0, {bound}): {int(index.min())} .. {int(index.max())}")


def _check_scatter_plan(plan: dict[str, torch.Tensor], M: int, OC: int, V: int) -> int:
    """The plan's output channel count C, after checking that every index it holds stays in bounds."""
    vertex, ptr, patch, row, turn = (plan[key] for key in PLAN_KEYS)
    int32 = (vertex, ptr, patch, row)
    if not all(t.dtype == torch.int32 and t.is_contiguous() for t in int32) or turn.dtype != torch.uint8:
        raise ValueError("expected a scatter plan of contiguous int32 vertex, ptr, patch, row and uint8 turn")
    entries = patch.numel()
    C = OC * M * 3 // entries if entries else 0
    ok = vertex.numel() == V and ptr.numel() == V + 1 and row.numel() == entries == turn.numel()
    ok = ok and C > 0 and OC % C == 0 and entries == M * (OC // C) * 3
    ok = ok and int(ptr[0]) == 0 and int(ptr[-1]) == entries and bool((ptr[1:] >= ptr[:-1]).all())
    ok = ok and sorted(vertex.tolist()) == list(range(V)) and int(turn.max()) <= 2
    ok = ok and int(patch.min()) >= 0 and int(patch.max()) < M
    ok = ok and int(row.min()) >= 0 and int(row.max()) + C <= OC
    if not ok:
        raise ValueError(f"the scatter plan does not fit {M} patches of {OC} orbit values onto {V} vertices")
    return C
