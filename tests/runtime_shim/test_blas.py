"""Which BLAS mlx runs on, decided before mlx is imported."""

import os
import subprocess
import sys

import pytest

from etmlx.runtime_shim import blas

# Only Linux has a BLAS to choose: mlx's macOS wheels link Accelerate, and etmlx loads nothing.
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mlx picks no BLAS off Linux (Accelerate on macOS)")

PROBE = "import etmlx; from etmlx.runtime_shim.blas import preload_openblas; print(preload_openblas())"


def _describe(**env) -> str:
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", PROBE], env=environment, capture_output=True, text=True, check=True).stdout


def test_system_openblas_is_used_when_present():
    installed = [path for path in blas.CANDIDATES if os.path.exists(path)]
    described = _describe(ETMLX_BLAS="")
    if installed:
        assert described.startswith(f"OpenBLAS ({installed[0]})")
    else:
        assert described.startswith("mlx's bundled reference BLAS (no system OpenBLAS")


def test_bundled_blas_on_request():
    assert "ETMLX_BLAS=bundled" in _describe(ETMLX_BLAS="bundled")


def test_too_late_when_mlx_came_first():
    probe = "import mlx.core; " + PROBE
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "import etmlx first" in out


LOAD_ORDER = """
import ctypes, etmlx
names = []
class Info(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_void_p), ("name", ctypes.c_char_p)]
Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t, ctypes.c_void_p)
def collect(info, size, data):
    names.append((info.contents.name or b"").decode())
    return 0
ctypes.CDLL(None).dl_iterate_phdr(Callback(collect), None)
print("\\n".join(names))
"""


def test_pytorch_keeps_its_own_blas_under_a_global_openblas():
    """OpenBLAS loaded globally before PyTorch's library would take over PyTorch's BLAS
    calls (eager attention 40x slower): PyTorch's library is loaded, and bound, first."""
    if not any(os.path.exists(path) for path in blas.CANDIDATES):
        pytest.skip("no system OpenBLAS: nothing is loaded globally")
    loaded = subprocess.run([sys.executable, "-c", LOAD_ORDER], env={**os.environ, "ETMLX_BLAS": ""},
                            capture_output=True, text=True, check=True).stdout.splitlines()
    order = [next(i for i, name in enumerate(loaded) if name.endswith(library))
             for library in ("libtorch_cpu.so", "libopenblas.so.0")]
    assert order[0] < order[1], loaded
