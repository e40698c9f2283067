"""Load a ``.pte`` and run its methods: the runtime shim's entry point."""

import threading
from collections.abc import Sequence

from etmlx.serializer.constants import BACKEND_ID

from . import method_io
from .backends import create_handle
from .plan import MethodRunner
from .direct import direct_runner
from .errors import IndexRangeError, NoSuchMethodError, PteFormatError
from .pte_file import PteFile, program_identity, read_pte
from .state import ProgramState
from .tensor_value import TensorValue


class MethodCalls:
    """Every method of a loaded program as an attribute: ``prog.forward(x)`` runs
    ``prog.run_method("forward", (x,))`` and returns its one output, or a tuple."""

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self.method_names:
            raise NoSuchMethodError(f"program has no method or attribute {name!r} (methods: {', '.join(self.method_names)})")

        def method(*inputs):
            outputs = self.run_method(name, inputs)
            return outputs[0] if len(outputs) == 1 else tuple(outputs)

        method.__name__ = name
        return method


class LoadedProgram(MethodCalls):
    """A program ready to run; every method is also an attribute: ``prog.forward(x)``.

    Loading allocates each method's planned memory and initializes its delegates,
    so state (mutable buffers, delegate caches) lives as long as this object. The file's
    bytes are not kept: once delegates have copied their weights, only the plan's own
    constants (views into the bytes) keep them alive. Calls are serialized: a method's
    planned memory is reused on every call.
    """

    def __init__(self, pte: PteFile):
        self.identity = program_identity(pte, BACKEND_ID)
        self._lock = threading.Lock()
        self._methods: dict[str, MethodRunner] = {}
        self._direct: dict = {}  # method -> direct_runner(...) or None
        self.state = ProgramState()
        for plan in pte.program.plans:
            handles = [self._init_delegate(pte, plan.name, i, d) for i, d in enumerate(plan.delegates)]
            self._methods[plan.name] = runner = MethodRunner(plan, pte, handles)
            self._direct[plan.name] = direct_runner(plan, runner.values, handles)

    def _init_delegate(self, pte: PteFile, method: str, index: int, delegate):
        try:
            return create_handle(
                delegate.id, pte.delegate_data(delegate), delegate.compile_specs, pte.named_data, self.state
            )
        except ValueError as error:  # a payload the backend cannot read is a malformed file
            raise PteFormatError(f"method {method!r}, delegate {index} ({delegate.id}): {error}") from error

    @property
    def method_names(self) -> list[str]:
        return list(self._methods)

    def read_state(self) -> dict:
        """The etmlx delegates' buffers (KV caches): ``ProgramState.snapshot``."""
        with self._lock:
            return self.state.snapshot()

    def write_state(self, arrays: dict) -> None:
        """Sets them: ``ProgramState.restore``."""
        with self._lock:
            self.state.restore(arrays)

    def run_method(self, name: str, inputs: Sequence) -> list:
        """Run method ``name``; returns its outputs as a list of copies.

        Tensor outputs come back as the kind (torch, numpy, mlx) of the first tensor
        input. Raises InputError when inputs do not match the plan.
        """
        try:
            runner = self._methods[name]
        except KeyError:
            raise NoSuchMethodError(f"program has no method {name!r} (methods: {', '.join(self._methods)})") from None
        values, plan = runner.values, runner.plan
        with self._lock:
            arrays = method_io.check_inputs(name, [values[i] for i in plan.inputs], inputs)
            kind = method_io.output_kind(inputs)
            try:
                direct = self._direct[name]
                if direct is not None:
                    return direct(arrays, kind)
                for index, array in zip(plan.inputs, arrays):
                    if isinstance(values[index], TensorValue):
                        values[index].set(array)
                    else:
                        values[index] = array
                runner.execute()
            except IndexRangeError as error:
                raise IndexRangeError(f"{name}: {error}") from None
            return [method_io.convert_output(values[i], kind) for i in plan.outputs]


def load(path_or_bytes) -> LoadedProgram:
    """Load a ``.pte`` from a path or bytes. Raises PteFormatError when malformed,
    BackendError when a delegate's backend is not registered."""
    return LoadedProgram(read_pte(path_or_bytes))
