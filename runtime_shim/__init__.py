"""etmlx.runtime_shim: read ExecuTorch ``.pte`` files and run them.

Kernel calls run through ``torch.ops`` (imported only when a plan has one),
delegates through backends registered with ``register_backend``; a fully
delegated program needs only numpy, flatbuffers and its backend.
"""

from .backends import DelegateHandle, register_backend, registered_backends
from .describe import DelegateInfo, MethodInfo, ProgramInfo, ValueInfo, describe
from .errors import BackendError, CapacityError, ExecutionError, IndexRangeError, InputError, NoSuchMethodError, OperatorError, PteFormatError
from .program import LoadedProgram, load
from .pte_file import NamedDataLookup, PteFile, read_pte
from .tensor_value import TensorValue

__all__ = [
    "BackendError",
    "CapacityError",
    "DelegateHandle",
    "DelegateInfo",
    "ExecutionError",
    "IndexRangeError",
    "InputError",
    "LoadedProgram",
    "MethodInfo",
    "NamedDataLookup",
    "NoSuchMethodError",
    "OperatorError",
    "ProgramInfo",
    "PteFile",
    "PteFormatError",
    "TensorValue",
    "ValueInfo",
    "describe",
    "load",
    "read_pte",
    "register_backend",
    "registered_backends",
]
