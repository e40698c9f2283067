"""Runtime half of a test backend: evaluates a JSON op list with numpy only.

Its ahead-of-time half is ``shim_aot_backend.py``. This module must not import torch:
the no-torch test runs a fully delegated program with it in a subprocess.
"""

import json

import numpy as np

from etmlx.runtime_shim import register_backend

BACKEND_ID = "EtmlxShimTestBackend"
NAMED_KEY = "shim_test/greeting"

_OPS = {"sin": np.sin, "add": np.add, "sub": np.subtract, "mul": np.multiply}

created = []  # every handle made, so tests can look at what the factory received


class FakeHandle:
    def __init__(self, processed, compile_specs, named_data, state):
        self.graph = json.loads(bytes(processed))
        self.compile_specs = compile_specs
        self.greeting = bytes(named_data.get(NAMED_KEY))
        self.calls = 0
        created.append(self)

    def execute(self, args):
        n_in = len(self.graph["inputs"])
        env = dict(zip(self.graph["inputs"], (a.array for a in args[:n_in])))
        for name, op, operands in self.graph["nodes"]:
            env[name] = _OPS[op](*(env[o] for o in operands))
        for out, name in zip(args[n_in:], self.graph["outputs"]):
            result = env[name]
            out.set(result.astype(out.array.dtype), result.shape)
        self.calls += 1


register_backend(BACKEND_ID, FakeHandle)
