"""Device helpers shared by the speed benchmarks: device choice, bf16 autocast, timing, peak memory, and
the check that flash attention is the SDPA backend the models actually use on CUDA.

Package code (``from eqvit.bench import device``), so the benchmarks import it the same way whether
they run as ``python benchmarks/NAME.py``, ``eqvit bench NAME`` or ``python -m eqvit.bench.NAME``.

* :func:`pick_device` -- ``None`` / ``"auto"``: CUDA when present, else the CPU; ``"cuda"`` without
  CUDA is a clear :class:`SystemExit`.
* :func:`autocast` -- bf16 autocast when enabled (the ``--amp`` flag); a no-op when not.
* :func:`sync`, :func:`time_ms` (CUDA events on CUDA, ``perf_counter`` on the CPU),
  :func:`reset_peak_memory` / :func:`peak_memory_mb` (``torch.cuda.max_memory_allocated``).
* :func:`flash_sdpa_check` -- runs ``F.scaled_dot_product_attention`` with only the flash backend
  enabled on q/k/v of the head dims our models use and reports, per shape, whether it ran.
* :func:`flash_model_check` -- one forward of a model with only the flash backend enabled
  ("no other backend is needed"), plus the SDPA calls the forward made (shapes, dtypes) and the aten
  attention kernels the default backend choice dispatched to (:class:`SdpaRecorder`).
* :func:`sdpa_context` -- pins the flash backend for the timed runs of a model that passed the check,
  so that flash is the backend used in the measurements.

Flash attention in PyTorch's CUDA SDPA (``sdp_utils.cpp``) needs fp16/bf16 q/k/v of one dtype, equal
head dims ``<= 256``, no arbitrary ``attn_mask``; a head dim that is not a multiple of 8 is accepted and
zero-padded to the next multiple of 8 inside ``F.scaled_dot_product_attention`` (older releases
rejected it), so such heads run on flash but pay for the padded width. Both facts are reported.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

FLASH_MAX_HEAD_DIM = 256
FLASH_DTYPES = (torch.float16, torch.bfloat16)

# The attention shapes ``(label, batch, heads, tokens, head_dim)`` of the models the speed benchmarks
# time, read off their SDPA calls (batch 1): SO3ViT 4xD (960 tokens, head dim 32; 4 heads at width 128,
# 8 at 256), the D4 square O(2) ViT at width 48 (257 tokens; coupled: 3 heads of 16; irrep-wise: 3
# heads of 8 for E and 12 heads of 2 for the 1-dim irreps), Platonic frames-as-heads (|G| * H heads:
# points at 256 tokens with head dims 40 (trivial, T), 20 (O), 8 (I); images at 64 tokens, 16 (C4) and
# 24 (D4); the I sphere model at 960 tokens, 60 heads of 2) and a head dim 64 for the wider configs.
DEFAULT_SHAPES: tuple[tuple[str, int, int, int, int], ...] = (
    ("so3vit_4x128 (4 heads x 32)", 1, 4, 960, 32),
    ("so3vit_4x256 (8 heads x 32)", 1, 8, 960, 32),
    ("head_dim 64 (wider SO3ViT / timm configs)", 1, 8, 960, 64),
    ("o2vit D4 coupled (3 heads x 16)", 1, 3, 257, 16),
    ("o2vit D4 irrep-wise, E (3 heads x 8)", 1, 3, 257, 8),
    ("o2vit D4 irrep-wise, 1-dim irreps (12 heads x 2)", 1, 12, 257, 2),
    ("platonic points trivial/T (12 heads x 40)", 1, 12, 256, 40),
    ("platonic points O (24 heads x 20)", 1, 24, 256, 20),
    ("platonic points I (60 heads x 8)", 1, 60, 256, 8),
    ("platonic image C4 (12 heads x 16)", 1, 12, 64, 16),
    ("platonic image D4 (8 heads x 24)", 1, 8, 64, 24),
    ("platonic sphere I (60 heads x 2)", 1, 60, 960, 2),
)


# --------------------------------------------------------------------------------------------
# device, autocast, timing, memory


def pick_device(name: str | None = None) -> torch.device:
    """``None`` or ``"auto"``: ``cuda`` when available, else ``cpu``. Asking for CUDA without it exits."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise SystemExit(f"--device {name!r}: {err}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(
                f"--device {name}: CUDA is not available on this machine (torch {torch.__version__}, "
                f"built for CUDA {torch.version.cuda}); use --device cpu or leave --device out"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SystemExit(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return device


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``enabled`` (on CUDA or, if asked, on the CPU); otherwise a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def amp_dtype(enabled: bool) -> str:
    """The compute dtype a benchmark reports: ``"bfloat16 (autocast)"`` or ``"float32"``."""
    return "bfloat16 (autocast)" if enabled else "float32"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one ``fn()``: CUDA events around it on CUDA (after a synchronize), else ``perf_counter``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated`` since the last :func:`reset_peak_memory`, in MiB (``None`` on the CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(device)}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info.update(
            cuda_device=props.name,
            cuda_capability=f"{props.major}.{props.minor}",
            cuda_memory_gb=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
    return info


# --------------------------------------------------------------------------------------------
# flash attention


def flash_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None) -> list[str]:
    """Why flash cannot take these q/k/v (the documented constraints; empty when it can)."""
    reasons = []
    if q.device.type != "cuda":
        reasons.append(f"tensors on {q.device.type}, flash needs CUDA")
    if q.dtype not in FLASH_DTYPES or not (q.dtype == k.dtype == v.dtype):
        reasons.append(f"dtypes q {q.dtype} k {k.dtype} v {v.dtype}: flash needs all float16 or all bfloat16")
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
        reasons.append(f"head dims differ: q {q.shape[-1]} k {k.shape[-1]} v {v.shape[-1]}")
    if q.shape[-1] > FLASH_MAX_HEAD_DIM:
        reasons.append(f"head_dim {q.shape[-1]} > {FLASH_MAX_HEAD_DIM}")
    if attn_mask is not None:
        reasons.append("an attn_mask is given: flash supports none (only is_causal)")
    return reasons


def padded_head_dim(head_dim: int) -> int:
    """The head dim flash computes with: ``head_dim`` rounded up to a multiple of 8."""
    return 8 * math.ceil(head_dim / 8)


def _error_reason(err: BaseException) -> str:
    """The first informative line of an SDPA error (``No available kernel. Aborting execution.`` etc.)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _flash_only() -> contextlib.AbstractContextManager:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


@contextlib.contextmanager
def _sdpa_warnings() -> Iterator[list[str]]:
    """Collects the (deduplicated) warnings PyTorch's SDPA backend selection gives for its refusals."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield messages
        finally:  # also when SDPA raised: the warnings say why
            for w in caught:
                text = " ".join(str(w.message).split())
                if text not in messages and len(messages) < 8:
                    messages.append(text)


def flash_sdpa_check(
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    shapes: Sequence[tuple[str, int, int, int, int]] = DEFAULT_SHAPES,
) -> dict[str, Any]:
    """Run SDPA with only the flash backend on ``[batch, heads, tokens, head_dim]`` q/k/v of each shape.

    Returns ``{"device", "dtype", "flash": "ok" | "failed for N shape(s)", "shapes": [...]}``; each shape
    reports ``ran`` (flash accepted and ran it), the documented ``eligible`` verdict with its
    ``reasons``, ``padded_head_dim`` (the width flash computes with) and, when flash ran, the largest
    difference to the math backend. On the CPU nothing runs: ``{"device": "cpu", "flash": "n/a"}``.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return {"device": device.type, "flash": "n/a"}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    for label, batch, heads, tokens, head_dim in shapes:
        q, k, v = (
            torch.randn(batch, heads, tokens, head_dim, device=device, dtype=dtype, generator=gen) for _ in range(3)
        )
        reasons = flash_reasons(q, k, v)
        row: dict[str, Any] = {
            "label": label,
            "shape": [batch, heads, tokens, head_dim],
            "dtype": str(dtype).removeprefix("torch."),
            "head_dim": head_dim,
            "padded_head_dim": padded_head_dim(head_dim),
            "padded": head_dim % 8 != 0,
            "eligible": not reasons,
            "reasons": reasons,
        }
        try:
            with _sdpa_warnings() as why, torch.no_grad(), _flash_only():
                out = F.scaled_dot_product_attention(q, k, v)
            torch.cuda.synchronize(device)
            with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
                ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
            row.update(ran=True, max_abs_diff_vs_math=float((out.float() - ref).abs().max()))
        except RuntimeError as err:
            row.update(ran=False, error=_error_reason(err), torch_warnings=why)
        rows.append(row)
    failed = [r for r in rows if not r["ran"]]
    return {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "flash": "ok" if not failed else f"failed for {len(failed)} of {len(rows)} shape(s)",
        "shapes": rows,
    }


_KERNELS = {
    "_scaled_dot_product_flash_attention_for_cpu": "cpu_flash",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


class _KernelSpy(TorchDispatchMode):
    """The fused attention kernel (if any) one SDPA call dispatched to, with its inputs' dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel: str | None = None
        self.dtypes: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        backend = _KERNELS.get(func.overloadpacket.__name__)
        if backend is not None and self.kernel is None:
            self.kernel = backend
            self.dtypes = sorted({_dtype_name(t.dtype) for t in args[:3]})
        return func(*args, **(kwargs or {}))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class SdpaRecorder(TorchFunctionMode):
    """Records every ``F.scaled_dot_product_attention`` call: q/k/v shapes, dtypes and the backend used.

    ``F.scaled_dot_product_attention`` picks its backend below the Python level; a dispatch mode
    inside each call sees the aten kernel it chose: ``flash`` (``_scaled_dot_product_flash_attention``),
    ``efficient``, ``cudnn``, ``cpu_flash`` (the CPU kernel), or none, which is the ``math`` path
    (plain matmuls and softmax). ``dtypes`` are those the kernel received (after autocast); for the
    math path, the inputs' dtypes with autocast applied.
    """

    def __init__(self) -> None:
        super().__init__()
        self.backends: Counter[str] = Counter()
        self.calls: list[dict[str, Any]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v = args[:3]
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        with _KernelSpy() as spy:
            out = func(*args, **kwargs)
        dtypes = spy.dtypes
        if not dtypes:
            fast = torch.get_autocast_dtype(q.device.type) if torch.is_autocast_enabled(q.device.type) else None
            dtypes = sorted(
                {_dtype_name(fast if fast is not None and t.is_floating_point() else t.dtype) for t in (q, k, v)}
            )
        backend = spy.kernel or "math"
        self.backends[backend] += 1
        self.calls.append(
            {
                "backend": backend,
                "q": list(q.shape),
                "k": list(k.shape),
                "v": list(v.shape),
                "dtypes": dtypes,
                "mask": mask is not None,
            }
        )
        return out

    def summary(self) -> dict[str, Any]:
        shapes = Counter((tuple(c["q"]), c["backend"], tuple(c["dtypes"])) for c in self.calls)
        return {
            "backends": dict(self.backends),
            "calls": [
                {"q_shape": list(s), "backend": b, "dtypes": list(d), "count": n} for (s, b, d), n in shapes.items()
            ],
            "head_dims": sorted({c["q"][-1] for c in self.calls}),
        }


def _as_tuple(inputs: Any) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def flash_model_check(
    model: torch.nn.Module,
    inputs: Any,
    device: torch.device,
    amp: bool = True,
) -> dict[str, Any]:
    """One ``no_grad`` forward of ``model`` (on ``device``) with only the flash backend enabled.

    ``flash`` is ``"ok"`` when every SDPA call ran on flash (so no other backend is needed), else
    ``"not flash-eligible: <reason>"`` (the RuntimeError SDPA raised). A second forward with the default
    backend choice records which attention kernels SDPA picks by itself (``default_backends``) and
    the shapes / dtypes of the calls. ``amp`` runs both under bf16 autocast, as the benchmarks do with
    ``--amp``; without it the model runs in float32, which flash does not take. On the CPU nothing
    runs: ``{"device": "cpu", "flash": "n/a"}``.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return {"device": device.type, "flash": "n/a"}
    args = _as_tuple(inputs)
    was_training = model.training
    model.eval()
    result: dict[str, Any] = {"device": str(device), "dtype": amp_dtype(amp)}
    try:
        with torch.no_grad(), autocast(device, amp), SdpaRecorder() as default:
            model(*args)
        result["default_backends"] = dict(default.backends)
        result.update(default.summary())
        padded = sorted({d for d in result["head_dims"] if d % 8})
        if padded:
            result["padded_head_dims"] = {str(d): padded_head_dim(d) for d in padded}
        try:
            with _sdpa_warnings() as why, torch.no_grad(), autocast(device, amp), _flash_only():
                with SdpaRecorder() as pinned:
                    model(*args)
            torch.cuda.synchronize(device)
            if not pinned.calls:
                result["flash"] = "no SDPA calls"
            elif set(pinned.backends) == {"flash"}:
                result["flash"] = "ok"
            else:  # cannot happen with only flash enabled, but the check is what the JSON claims
                result["flash"] = f"flash enabled alone, yet kernels {dict(pinned.backends)} ran"
            result["flash_calls"] = sum(pinned.backends.values())
        except RuntimeError as err:
            reasons = sorted({"; ".join(_call_reasons(c)) for c in default.calls} - {""})
            detail = f" ({' | '.join(reasons)})" if reasons else ""
            result["flash"] = f"not flash-eligible: {_error_reason(err)}{detail}"
            result["torch_warnings"] = why
    except Exception as err:  # a model that fails on CUDA at all: report it, do not stop the benchmark
        result["flash"] = f"forward failed: {type(err).__name__}: {_error_reason(err)}"
        result["traceback"] = traceback.format_exc(limit=3).splitlines()[-3:]
    finally:
        model.train(was_training)
    return result


def _call_reasons(call: dict[str, Any]) -> list[str]:
    """:func:`flash_reasons` for a recorded call (its shapes and dtypes; the kernel inputs after autocast)."""
    reasons = []
    dtypes = call["dtypes"]
    if len(dtypes) > 1 or getattr(torch, dtypes[0]) not in FLASH_DTYPES:
        reasons.append(f"dtypes {'/'.join(dtypes)}: flash needs all float16 or all bfloat16")
    dims = {call["q"][-1], call["k"][-1], call["v"][-1]}
    if len(dims) > 1:
        reasons.append(f"head dims differ: {sorted(dims)}")
    if max(dims) > FLASH_MAX_HEAD_DIM:
        reasons.append(f"head_dim {max(dims)} > {FLASH_MAX_HEAD_DIM}")
    if call.get("mask"):
        reasons.append("an attn_mask is given")
    return reasons


def sdpa_context(device: torch.device, check: dict[str, Any] | None) -> contextlib.AbstractContextManager:
    """Only the flash backend when ``check`` (a :func:`flash_model_check` result) says flash takes every call.

    Used around the timed runs, so that on CUDA the measured attention is flash; elsewhere a no-op.
    """
    if torch.device(device).type == "cuda" and check is not None and check.get("flash") == "ok":
        return _flash_only()
    return contextlib.nullcontext()


def backend_used(check: dict[str, Any] | None) -> str:
    """What the JSON says about the SDPA backend of the timed runs."""
    if check is None or check.get("flash") == "n/a":
        return "default (cpu)"
    if check.get("flash") == "ok":
        return "flash (pinned with sdpa_kernel)"
    return f"default {check.get('default_backends')} ({check.get('flash')})"


@contextlib.contextmanager
def record_sdpa() -> Iterator[SdpaRecorder]:
    """``with record_sdpa() as rec: model(x)`` -- the attention kernels a forward dispatched to."""
    with SdpaRecorder() as rec:
        yield rec


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``eqvit bench device [--device cuda] [--out FILE]`` (or ``python benchmarks/_device.py``): the device and
    the flash SDPA check as JSON."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    result = {"torch": torch.__version__, **device_info(device), "check": flash_sdpa_check(device)}
    text = json.dumps(result, indent=1)
    print(text)
    for row in result["check"].get("shapes", []):
        verdict = "flash ran" if row["ran"] else f"flash refused: {row['error']}"
        pad = f" (padded to {row['padded_head_dim']})" if row["padded"] else ""
        print(f"{row['label']:<52} head_dim {row['head_dim']:>3}{pad}: {verdict}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
