"""A process that only runs programs on ExecuTorch's runtime does not import ExecuTorch's
export toolchain (``native/executorch_runtime.py``), and can still import it after."""

import subprocess
import sys

import etmlx
from examples import models

CHILD = """
import sys
import numpy as np
import etmlx
program = etmlx.load(sys.argv[1], runtime="executorch")
out = program.forward(np.ones((4, 64), dtype=np.float32))
assert "executorch.exir" not in sys.modules, "the runtime imported executorch.exir"
from executorch.exir import to_edge  # the toolchain's init still runs, when asked for
import executorch.exir._warnings as warnings
assert warnings is sys.modules["executorch.exir._warnings"] and callable(to_edge)
print(out.shape)
"""


def test_running_a_program_does_not_import_the_export_toolchain(tmp_path):
    module, inputs, _ = models.mlp()
    path = tmp_path / "mlp.pte"
    etmlx.export(module, inputs, path)
    child = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip().splitlines()[-1] == "(4, 10)"
