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
