"""Export a module through etmlx, run the .pte on every runtime (``runtimes.py``), and
report what was serialized, so a test can assert both parity and which MLX nodes ran."""

import os
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

import torch

import runtimes
from etmlx.pipeline import lower_methods, trace
from etmlx.inspection import inspect_program

TOLERANCE = {  # (rtol, atol) by dtype
    torch.float64: (1e-9, 1e-9),  # declined by MLX: computed by PyTorch on the CPU fallback
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (4e-2, 4e-2),
}


@dataclass
class Lowered:
    inspect: dict  # etmlx.inspection.inspect_program(...)
    report: object  # PartitionReport
    pte: bytes

    @cached_property
    def program(self):
        """The .pte loaded on every runtime (``runtimes.py``), on first use."""
        return runtimes.load(self.pte)

    @property
    def nodes(self) -> list:
        """IR node types of every etmlx delegate of ``forward``, in order."""
        method = self.inspect["methods"]["forward"]
        return [n for d in method["delegates"] for n in d.get("nodes", [])]

    @property
    def kernels(self) -> list:
        return self.inspect["methods"]["forward"]["kernels"]

    @property
    def delegates(self) -> list:
        return self.inspect["methods"]["forward"]["delegates"]


class Fn(torch.nn.Module):
    """A module whose forward is ``fn``: one tiny model per test case."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def lower(module, inputs, dynamic_shapes=None) -> Lowered:
    return lower_exported(trace(module, inputs, dynamic_shapes))


def lower_exported(exported_program) -> Lowered:
    """A ``torch.export`` program lowered as method ``forward``."""
    program, report = lower_methods({"forward": exported_program})
    return Lowered(inspect_program(program.buffer), report, program.buffer)


def assert_close(actual, expected, dtype=None):
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, dtype)
        return
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype}, eager gives {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), f"shape {tuple(actual.shape)}, eager {tuple(expected.shape)}"
    if expected.dtype.is_floating_point:
        rtol, atol = TOLERANCE[dtype or expected.dtype]
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert torch.equal(actual, expected), f"{actual} != {expected}"


def check_parity(module, inputs, dynamic_shapes=None, run_with=None) -> Lowered:
    """Lowers ``module`` and checks the .pte against eager on ``inputs`` and on each
    tuple in ``run_with`` (other shapes for dynamic dims). Returns what was lowered."""
    module = module.eval()
    lowered = lower(module, inputs, dynamic_shapes)
    for args in [inputs] + list(run_with or []):
        with torch.no_grad():
            expected = module(*args)
        assert_close(lowered.program.forward(*args), expected)
    record_checked(op for op, entry in lowered.report.operators.items() if entry.delegated)
    return lowered


# Per test file, the operators its tests lowered and checked against eager, for the
# file's coverage test. Keyed by file, so the programs of other files that ran in the
# same worker cannot fill in for one that no test of this file built.
_CHECKED = defaultdict(set)


def _test_file() -> str:
    return os.environ["PYTEST_CURRENT_TEST"].split("::")[0]


def record_checked(operators) -> None:
    _CHECKED[_test_file()].update(operators)


def checked_in_this_file() -> set:
    return set(_CHECKED[_test_file()])


# What etmlx.llm.causal_lm's programs run outside MLX: the read of the attention window's size
# from the last cache position (then ExecuTorch's scalar ops round it to a bucket).
WINDOW_READ = ["aten::select_copy.int_out", "aten::_local_scalar_dense.default"]


def tensor_kernels(kernels: list) -> list:
    """``kernels`` less ExecuTorch's scalar ops (``executorch_prim::``: size arithmetic)."""
    return [k for k in kernels if not k.startswith("executorch_prim::")]
