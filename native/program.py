"""``etmlx.load(path, runtime="executorch")``: a ``.pte`` run by ExecuTorch's own C++
runtime, its etmlx delegates by the native backend, behind the Python runtime's
calling convention: torch, numpy or mlx arrays in, the same kind out, inputs checked
against the plan with the same ``InputError``s."""

import os
import threading
from collections.abc import Sequence

import numpy as np

from etmlx.runtime_shim import method_io
from etmlx.runtime_shim.errors import ExecutionError, IndexRangeError, InputError, NoSuchMethodError, PteFormatError
from etmlx.runtime_shim.program import MethodCalls
from etmlx.runtime_shim.pte_file import program_identity, read_pte
from etmlx.serializer.constants import BACKEND_ID

from . import executorch_runtime
from .library import (
    INDEX_RANGE_ERROR, clear_last_error, last_error, last_error_detail, read_state, take_last_state, write_state,
)
from .plan_checks import check_program


class ExecutorchProgram(MethodCalls):
    """A program loaded by ``executorch.runtime``; every method is also an attribute.

    All methods are loaded (their delegates initialized) here, so a malformed payload
    fails at load. Calls on one program are serialized: ExecuTorch's methods reuse
    their planned memory on every call.
    """

    def __init__(self, path_or_bytes):
        Runtime = executorch_runtime.runtime()
        pte = read_pte(path_or_bytes)  # the plans, for checking inputs; PteFormatError if malformed
        check_program(pte.program)
        self._expected = {plan.name: method_io.expected_inputs(plan) for plan in pte.program.plans}
        _check_kernels(pte, set(Runtime.get().operator_registry.operator_names))
        source = os.fspath(path_or_bytes) if isinstance(path_or_bytes, (str, os.PathLike)) else bytes(path_or_bytes)
        self.identity = program_identity(pte, BACKEND_ID)
        clear_last_error()
        take_last_state()  # what an earlier load left
        try:
            self._program = Runtime.get().load_program(source)
            self._methods = {name: self._program.load_method(name) for name in self._expected}
        except RuntimeError as error:
            raise PteFormatError(f"ExecuTorch could not load the program: {last_error() or error}") from error
        self._state = take_last_state()  # the one its delegates share; 0 without etmlx delegates
        self._lock = threading.Lock()

    @property
    def method_names(self) -> list[str]:
        return list(self._methods)

    def read_state(self) -> dict:
        """The etmlx delegates' buffers (KV caches), as the Python runtime's ``read_state``."""
        with self._lock:
            return read_state(self._state) if self._state else {}

    def write_state(self, arrays: dict) -> None:
        """Sets them, as the Python runtime's ``write_state``."""
        with self._lock:
            if not self._state:
                raise InputError("this program has no etmlx delegate, so no state to restore")
            write_state(self._state, arrays)

    def run_method(self, name: str, inputs: Sequence) -> list:
        """Run method ``name``; returns its outputs (as the kind of the first tensor input)."""
        method = self._method(name)
        arrays = method_io.check_inputs(name, self._expected[name], inputs)
        kind = method_io.output_kind(inputs)
        args = [_torch_input(a, spec) for a, spec in zip(arrays, self._expected[name])]
        with self._lock:
            clear_last_error()
            try:
                outputs = method.execute(args)
            except RuntimeError as error:
                kind, detail = last_error_detail()
                if kind == INDEX_RANGE_ERROR:
                    raise IndexRangeError(f"{name}: {detail}") from None
                raise ExecutionError(f"method {name!r}: {last_error() or error}") from error
        return [method_io.convert_torch_output(o, kind) for o in outputs]

    def _method(self, name: str):
        try:
            return self._methods[name]
        except KeyError:
            raise NoSuchMethodError(f"program has no method {name!r} (methods: {', '.join(self._methods)})") from None


def _check_kernels(pte, registered: set) -> None:
    """Names the operators MLX declined that ExecuTorch's kernel library lacks, which
    ExecuTorch itself reports only as error 0x14 (OperatorMissing)."""
    # ExecuTorch looks an operator up by its name alone when the file gives no overload
    # (read back as "default"), as for aten::_local_scalar_dense.
    names = {op.name if op.overload == "default" else op.qualified for plan in pte.program.plans for op in plan.operators}
    missing = sorted(names - registered)
    if missing:
        raise PteFormatError(
            f"ExecuTorch's runtime has no kernel for {', '.join(missing)}, which MLX declined; run this program "
            "with etmlx's Python runtime (etmlx.load(path)), or change the model so MLX or ExecuTorch can run it"
        )


def _torch_input(value, spec):
    """A checked input as ExecuTorch's runtime takes it: a contiguous torch tensor."""
    if not isinstance(value, np.ndarray):
        return value
    import torch

    if value.size == 0:
        # numpy gives empty arrays zero strides, which ExecuTorch's bindings abort on
        tensor = torch.empty(value.shape, dtype=torch.from_numpy(value).dtype)
    else:
        tensor = torch.from_numpy(value if value.flags.c_contiguous else value.copy())  # 0-d stays 0-d
    return tensor.view(torch.bfloat16) if spec.dtype is method_io.BFLOAT16 else tensor
