"""The runtimes every test program runs on: one switch for the whole suite.

``ETMLX_TEST_RUNTIMES`` (default ``python,executorch``) names them. ``load(pte)``
returns a program that runs each call on every one of them and checks that they agree
— the native runtime runs the same MLX kernels as the Python one, so their outputs
must be equal (floats within 1e-6) — and returns the first runtime's outputs. A call
that fails must fail the same way on every runtime. So each test that checks a program
against eager PyTorch checks both runtimes, with no copy of the test.
"""

import os

import numpy as np
import torch

import etmlx
from etmlx.runtime_shim.program import MethodCalls

RUNTIMES = tuple(os.environ.get("ETMLX_TEST_RUNTIMES", ",".join(etmlx.RUNTIMES)).split(","))

# Same kernels, so the same numbers: what a reordered reduction may change, no more.
AGREEMENT = dict(rtol=1e-6, atol=1e-6)


def load(pte) -> MethodCalls:
    return AllRuntimes(pte)


class AllRuntimes(MethodCalls):
    def __init__(self, pte):
        self.programs = {runtime: etmlx.load(pte, runtime=runtime) for runtime in RUNTIMES}

    @property
    def method_names(self) -> list:
        return self.programs[RUNTIMES[0]].method_names

    def run_method(self, name, inputs):
        results, errors = {}, {}
        for runtime, program in self.programs.items():
            try:
                results[runtime] = program.run_method(name, inputs)
            except Exception as error:  # compared below: every runtime must fail alike
                errors[runtime] = error
        if errors:
            first = errors.get(RUNTIMES[0]) or next(iter(errors.values()))
            kinds = {runtime: type(error).__name__ for runtime, error in errors.items()}
            assert len(errors) == len(RUNTIMES) and len(set(kinds.values())) == 1, (
                f"{name}: runtimes disagree: failed {kinds} ({first}), succeeded {sorted(results)}"
            )
            raise first
        reference = results[RUNTIMES[0]]
        for runtime in RUNTIMES[1:]:
            assert_agree(results[runtime], reference, f"{name} on {runtime} vs {RUNTIMES[0]}")
        return reference


def assert_agree(actual: list, expected: list, where: str) -> None:
    assert len(actual) == len(expected), f"{where}: {len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if not hasattr(e, "shape"):
            assert a == e, f"{where}: output {i} is {a}, expected {e}"
            continue
        a, e = _as_torch(a), _as_torch(e)
        assert a.dtype == e.dtype and a.shape == e.shape, f"{where}: output {i} is {a.dtype}{list(a.shape)}, expected {e.dtype}{list(e.shape)}"
        if e.dtype.is_floating_point:
            torch.testing.assert_close(a.float(), e.float(), **AGREEMENT, equal_nan=True, msg=lambda m: f"{where}: output {i}: {m}")
        else:
            assert torch.equal(a, e), f"{where}: output {i} differs"


def _as_torch(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    import mlx.core as mx

    if isinstance(x, mx.array):
        return torch.from_numpy(np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x))
    return torch.from_numpy(np.asarray(x))
