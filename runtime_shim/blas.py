"""Puts a system OpenBLAS under MLX's CPU backend on Linux.

The ``mlx[cpu]`` wheel links a reference BLAS: a 1024x1024 float32 matmul took
362 ms with it and 12 ms with Debian's OpenBLAS on a 2-core x86-64 machine. Loading
OpenBLAS with RTLD_GLOBAL before mlx is imported makes the dynamic linker resolve
mlx's ``cblas_*`` symbols to OpenBLAS. Set ``ETMLX_BLAS=bundled`` to keep mlx's own.

A global OpenBLAS would also take over the BLAS calls inside PyTorch (its MKL's symbols
are exported, and a library loaded later binds to the first definition): its pthreads
then run inside PyTorch's OpenMP threads, and eager attention took 26 ms instead of
0.6 ms (DeiT-S 1.2 s instead of 0.1 s). So PyTorch's library is loaded first, bound to
its own BLAS; mlx still finds OpenBLAS.
"""

import ctypes
import importlib.util
import os
import sys

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

_state = {"blas": None}


def preload_openblas() -> str:
    """Loads OpenBLAS ahead of mlx if possible; returns a description of the BLAS in use."""
    if _state["blas"] is None:
        _state["blas"] = _choose()
    return _state["blas"]


def _choose() -> str:
    if not sys.platform.startswith("linux"):
        return "platform BLAS (Accelerate on macOS)"
    if os.environ.get("ETMLX_BLAS", "").lower() == "bundled":
        return "mlx's bundled reference BLAS (ETMLX_BLAS=bundled)"
    if "mlx.core" in sys.modules:
        return "mlx's bundled reference BLAS (mlx was imported before etmlx; import etmlx first for OpenBLAS)"
    for path in CANDIDATES:
        if os.path.exists(path):
            _bind_torch_to_its_own_blas()
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return f"OpenBLAS ({path})"
    return "mlx's bundled reference BLAS (no system OpenBLAS: apt-get install libopenblas0-pthread)"


def _bind_torch_to_its_own_blas() -> None:
    """Loads PyTorch's CPU library (not PyTorch: 0.2 s, not 1.5) unless it is loaded."""
    if "torch" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):  # blocked, as in a runtime that runs without PyTorch
        return
    library = spec and spec.origin and os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cpu.so")
    if library and os.path.exists(library):
        try:
            ctypes.CDLL(library, mode=ctypes.RTLD_LOCAL)
        except OSError:
            pass  # PyTorch will say why when it is imported
