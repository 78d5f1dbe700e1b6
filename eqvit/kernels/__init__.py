"""Optional compiled CPU kernels for the inference form (:func:`eqvit.fuse`).

eqvit is pure PyTorch; where the structure of a group allows a kernel that PyTorch has no operator for
(SO(3)-RoPE's per-token block-diagonal rotation; the change of the icosphere tokenizer's patches into
the basis of their 120-degree turns), the C++ source ships in this folder. It is built on
first use with the machine's C++ compiler (``$CXX``, else ``c++``; ``-O3 -march=native -fopenmp``, each
of the last two dropped where the compiler refuses it), cached under ``$EQVIT_CACHE/kernels`` (default
``~/.cache/eqvit``) and called through :mod:`ctypes`. No torch headers are needed, so the build takes
seconds. Where no compiler works, :func:`load` returns None and :func:`eqvit.fuse` keeps the pure
PyTorch form; ``EQVIT_KERNELS=0`` asks for that explicitly.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from eqvit.utils import cache_dir

__all__ = ["CompiledKernel", "KernelUnavailable", "kernels_enabled", "load"]

SOURCE_DIR = Path(__file__).parent
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
# Tried in turn: tuned for this CPU (the cache key names it) and threaded with OpenMP (libgomp.so.1, the
# runtime torch itself loads on Linux, so the kernels share its threads), then without either.
OPTIONAL_FLAGS = (("-march=native", "-fopenmp"), ("-fopenmp",), ("-march=native",), ())


class KernelUnavailable(RuntimeError):
    """A kernel could not be built or loaded (no compiler, a compile error); the message says why."""


def kernels_enabled() -> bool:
    """False when ``EQVIT_KERNELS=0`` (or ``false`` / ``off``): :func:`load` then never builds."""
    return os.environ.get("EQVIT_KERNELS", "1").strip().lower() not in ("0", "false", "off", "no")


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CXX", "c++"))


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (Linux), else the platform."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(dict.fromkeys(keep))  # every core repeats them


def _build(source: Path, target: Path) -> None:
    """Compile ``source`` into the shared library ``target`` (atomically: a temporary file, then a rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    errors = []
    try:
        for extra in OPTIONAL_FLAGS:
            cmd = [*_compiler(), *FLAGS, *extra, "-o", tmp, str(source)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            except (OSError, subprocess.SubprocessError) as err:
                raise KernelUnavailable(f"cannot run the C++ compiler {cmd[0]!r}: {err}") from err
            if done.returncode == 0:
                os.replace(tmp, target)
                return
            errors.append(f"$ {shlex.join(cmd)}\n{done.stderr.strip()}")
        raise KernelUnavailable(f"building {source.name} failed:\n" + "\n".join(errors))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build_and_load(name: str) -> ctypes.CDLL:
    source = SOURCE_DIR / f"{name}.cpp"
    if not source.is_file():
        raise KernelUnavailable(f"no kernel source {source}")
    key = hashlib.sha256(
        b"\0".join([source.read_bytes(), repr((_compiler(), FLAGS, OPTIONAL_FLAGS)).encode(), _cpu_id().encode()])
    ).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{name}-{key}.so"
    if not target.is_file():
        _build(source, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as err:
        raise KernelUnavailable(f"cannot load {target}: {err}") from err


@functools.cache
def _outcome(name: str) -> ctypes.CDLL | KernelUnavailable:
    """Built and loaded once per process; a failure is kept too, so it is not retried on every call."""
    try:
        return _build_and_load(name)
    except KernelUnavailable as err:
        return err


def load(name: str, *, warn: bool = True) -> ctypes.CDLL | None:
    """The compiled kernel library ``name`` (``eqvit/kernels/{name}.cpp``), built once and cached.

    None when kernels are disabled (``EQVIT_KERNELS=0``) or cannot be built here; with ``warn`` a
    failed build says why once (a RuntimeWarning), and the caller keeps its PyTorch form.
    """
    if not kernels_enabled():
        return None
    outcome = _outcome(name)
    if isinstance(outcome, KernelUnavailable):
        if warn:
            _warn_once(name, str(outcome))
        return None
    return outcome


@functools.cache
def _warn_once(name: str, reason: str) -> None:
    message = f"eqvit kernel {name!r} unavailable, keeping the PyTorch form: {reason}"
    warnings.warn(message, RuntimeWarning, stacklevel=3)


class CompiledKernel:
    """Base of a compiled kernel's Python binding (:mod:`eqvit.kernels.so3`, :mod:`eqvit.kernels.icosphere`).

    A subclass names its source (``library``: ``eqvit/kernels/{library}.cpp``) and binds the library's
    functions in ``__init__(lib)``. One binding exists per loaded library and every fused model shares it:
    a deep copy keeps it, and a pickle loads (or builds) it again where it is unpickled.
    """

    library: str
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)

    def supports(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether the compiled code can take ``x`` with ``weight``: CPU tensors of one of :attr:`dtypes`, the
        same for both, and ``x`` outside autograd (ctypes writes are invisible to it). Subclasses add their
        layouts' conditions."""
        return (
            x.device.type == "cpu"
            and x.dtype in self.dtypes
            and weight.dtype == x.dtype
            and weight.device.type == "cpu"
            and not x.requires_grad
        )

    @classmethod
    def load(cls, *, warn: bool = True):
        """The binding, or None where the library cannot be built (see :func:`load`)."""
        lib = load(cls.library, warn=warn)
        return None if lib is None else _binding(cls, lib)

    def __deepcopy__(self, memo: dict) -> CompiledKernel:
        return self

    def __reduce__(self) -> tuple:
        return (_load_or_raise, (type(self),))


@functools.cache
def _binding(cls: type[CompiledKernel], lib: ctypes.CDLL) -> CompiledKernel:
    return cls(lib)


def _load_or_raise(cls: type[CompiledKernel]) -> CompiledKernel:
    kernel = cls.load()
    if kernel is None:
        raise KernelUnavailable(f"this model was fused with the kernel {cls.library!r}, which cannot be built here")
    return kernel
