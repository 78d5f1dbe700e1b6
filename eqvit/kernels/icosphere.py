"""The icosphere tokenizer's passes into and out of the basis of a patch's turns (``icosphere_c3.cpp``).

:mod:`eqvit.nn.fused_icosphere` factors the lifting and the unpatchify over the patch's 120-degree turns
into four weight planes; this module binds the compiled loops around their one batched product, once per
input layout.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from eqvit.kernels import CompiledKernel

__all__ = ["IcosphereC3Kernel", "outside_kernels"]

_LONG, _INT, _PTR = ctypes.c_long, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "lift_features": [_PTR, _LONG, _LONG, _LONG, _LONG, _LONG, _PTR, _LONG, _LONG, _PTR, _INT],
    "token_features": [_PTR, _LONG, _LONG, _LONG, _PTR, _INT],
    "normed_token_features": [_PTR, _LONG, _LONG, _LONG, ctypes.c_double, _PTR, _INT],
    "tokens": [_PTR, _PTR, _LONG, _LONG, _PTR, _INT],
    "scatter": [_PTR, _PTR, _LONG, _LONG, _LONG, _LONG, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _LONG, _PTR, _INT],
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
        lib.eqvit_c3_max_channels.restype = _LONG
        self.max_channels = int(lib.eqvit_c3_max_channels())
        self._fns: dict[tuple[str, torch.dtype], ctypes._CFuncPtr] = {}
        for name, argtypes in _SIGNATURES.items():
            for dtype, suffix in _SUFFIX.items():
                fn = getattr(lib, f"eqvit_c3_{name}_{suffix}")
                fn.argtypes, fn.restype = argtypes, None
                self._fns[name, dtype] = fn

    def supports(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether the passes can run on ``x`` with factored weights like ``weight`` (else the dense form)."""
        return super().supports(x, weight) and not outside_kernels(x)

    def bind_lift(
        self, x: torch.Tensor, orbit_vertex: torch.Tensor, planes_t: torch.Tensor, bias: torch.Tensor
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The lifting for inputs laid out like ``x [B, C, V]``: ``tokens [B, 3 M, D] = lift(x)``.

        ``orbit_vertex [M, O, 3]``: the vertices of each patch's tap orbits (member r of orbit o);
        ``planes_t [4, O C, D]``: the four weight planes (:func:`~eqvit.nn.fused_icosphere.c3_planes`),
        transposed; ``bias [D]``: the tokens' bias.
        """
        if x.ndim != 3 or orbit_vertex.ndim != 3 or orbit_vertex.shape[2] != 3:
            raise ValueError(
                f"expected x [B, C, V] and orbit vertices [M, O, 3]; got x {list(x.shape)}, "
                f"orbit vertices {list(orbit_vertex.shape)}"
            )
        B, C, V = x.shape
        M, O, _ = orbit_vertex.shape
        OC, D = O * C, planes_t.shape[-1]
        self._check(x, planes_t, bias)
        _check_planes(planes_t, bias, (OC, D), (D,))
        _check_index(orbit_vertex, V, "orbit vertex")
        sxb, sxc, sxv = x.stride()
        features, tokens = self._fns["lift_features", x.dtype], self._fns["tokens", x.dtype]
        dtype, R = x.dtype, B * M

        def lift(x: torch.Tensor) -> torch.Tensor:
            threads = torch.get_num_threads()
            inputs = torch.empty(4, R, OC, dtype=dtype)
            features(x.data_ptr(), B, C, sxb, sxc, sxv, orbit_vertex.data_ptr(), M, O, inputs.data_ptr(), threads)
            products = torch.bmm(inputs, planes_t)  # [4, R, D]
            out = torch.empty(B, 3 * M, D, dtype=dtype)
            tokens(products.data_ptr(), bias.data_ptr(), R, D, out.data_ptr(), threads)
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

        ``planes [4, O C, D]``: the four weight planes (rows (o, c)); ``bias [O C]``: the orbit values'
        bias; ``scatter_plan``: ``vertex``, ``ptr``, ``patch``, ``row`` (int32) and ``turn`` (uint8), see
        ``icosphere_c3.cpp``; ``inv_count [V]``: 1 / (what each vertex receives). With ``norm_eps`` each
        token is first normalised over its D channels, a LayerNorm whose affine the planes and bias hold.
        """
        B, N, D = tokens.shape
        M, V = N // 3, inv_count.shape[0]
        OC = planes.shape[1]
        self._check(tokens, planes, bias, inv_count)
        if not tokens.is_contiguous() or N % 3:
            raise ValueError(
                f"expected contiguous tokens [B, 3 M, D]; got tokens {list(tokens.shape)} "
                f"(contiguous: {tokens.is_contiguous()})"
            )
        _check_planes(planes, bias, (OC, D), (OC,))
        C = _check_scatter_plan(scatter_plan, M, OC, V)
        if C > self.max_channels:
            raise ValueError(f"the kernel scatters at most {self.max_channels} channels, got {C}")
        plan = [scatter_plan[key].data_ptr() for key in PLAN_KEYS]
        scatter = self._fns["scatter", tokens.dtype]
        if norm_eps is None:
            features = self._fns["token_features", tokens.dtype]
        else:
            normed = self._fns["normed_token_features", tokens.dtype]

            def features(tokens_ptr: int, R: int, D: int, sr: int, out_ptr: int, threads: int) -> None:
                normed(tokens_ptr, R, D, sr, norm_eps, out_ptr, threads)

        dtype, R = tokens.dtype, B * M

        def unpatchify(tokens: torch.Tensor) -> torch.Tensor:
            threads = torch.get_num_threads()
            inputs = torch.empty(4, R, D, dtype=dtype)
            features(tokens.data_ptr(), R, D, 3 * D, inputs.data_ptr(), threads)
            # [4, O C, R]: with the R rows on the long side the product runs 1.4x faster than [4, R, O C]
            products = torch.bmm(planes, inputs.transpose(1, 2))
            out = torch.empty(B, C, V, dtype=dtype)
            scatter(
                products.data_ptr(),
                bias.data_ptr(),
                B,
                M,
                OC,
                C,
                *plan,
                inv_count.data_ptr(),
                V,
                out.data_ptr(),
                threads,
            )
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


def _check_planes(planes: torch.Tensor, bias: torch.Tensor, plane: tuple[int, int], bias_shape: tuple[int]) -> None:
    """Four weight planes ``[4, *plane]`` and a bias ``bias_shape``."""
    if planes.shape != (4, *plane) or bias.shape != bias_shape:
        raise ValueError(
            f"expected weight planes {[4, *plane]} and bias {list(bias_shape)}; got "
            f"{list(planes.shape)} and {list(bias.shape)}"
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
