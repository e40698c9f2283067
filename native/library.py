"""The loaded ``libetmlx_backend``: loading it registers ``EtMlxBackend`` with
ExecuTorch's runtime; its C interface (``native/src/c_api.cpp``) reports errors and
what the backend implements."""

import ctypes
import os
import pathlib

import numpy as np

from etmlx.errors import EtMlxError
from etmlx.runtime_shim.errors import InputError
from etmlx.runtime_shim.state import check_buffer_names
from etmlx.serializer.constants import ERROR_KINDS
from etmlx.serializer.ir import NUMPY_STORAGE, TORCH_DTYPE_NAMES

from etmlx.native_build import LIBRARY_NAME, default_build_dir


class NativeBackendError(EtMlxError, ImportError):
    """The native backend is not built, or does not load."""


def library_path() -> pathlib.Path:
    """Where this process loads the backend from: ``$ETMLX_NATIVE_LIBRARY``, else where
    ``etmlx build-native`` puts it."""
    override = os.environ.get("ETMLX_NATIVE_LIBRARY")
    return pathlib.Path(override) if override else default_build_dir() / LIBRARY_NAME


def _load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        raise NativeBackendError(
            f"etmlx's native backend is not built ({path} is missing): run `etmlx build-native` "
            "(`make native` in a checkout), or set ETMLX_NATIVE_LIBRARY to a libetmlx_backend you built"
        )
    try:
        library = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise NativeBackendError(f"cannot load etmlx's native backend {path}: {error}") from error
    library.etmlx_native_last_error.restype = ctypes.c_char_p
    library.etmlx_native_last_error_detail.restype = ctypes.c_char_p
    library.etmlx_native_operations.restype = ctypes.c_char_p
    library.etmlx_native_clear_last_error.restype = None
    library.etmlx_native_parse_byte_count.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
    library.etmlx_native_take_last_state.restype = ctypes.c_uint64
    library.etmlx_native_state_names.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p)]
    library.etmlx_native_state_read.argtypes = [
        ctypes.c_uint64, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64),
    ]
    library.etmlx_native_state_write.argtypes = [
        ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p,
        ctypes.c_uint64, ctypes.c_int,
    ]
    if not library.etmlx_native_registered():
        raise NativeBackendError(
            "EtMlxBackend did not register with ExecuTorch's runtime (another backend of that name, "
            "or a full registry); see the log above"
        )
    return library


_LIBRARY = _load()


INDEX_RANGE_ERROR = ERROR_KINDS.index("IndexRange")  # the C interface's error kinds


def last_error() -> str:
    """The logged reason behind the last error the backend returned on this thread
    (backend, method, what went wrong; '' if none)."""
    return _LIBRARY.etmlx_native_last_error().decode("utf-8", "replace")


def last_error_detail() -> tuple:
    """(kind, what went wrong) of the last error on this thread; kind 0 if none."""
    return _LIBRARY.etmlx_native_last_error_kind(), _LIBRARY.etmlx_native_last_error_detail().decode("utf-8", "replace")


def clear_last_error() -> None:
    _LIBRARY.etmlx_native_clear_last_error()


def operations() -> set:
    """The IR operations the native runtime implements: node tables (``"Sdpa"``) and the
    operations of family tables (``"Unary.Neg"``)."""
    return set(_LIBRARY.etmlx_native_operations().decode().split())


def format_version() -> int:
    """The newest payload format version the native runtime reads."""
    return _LIBRARY.etmlx_native_format_version()


def parse_byte_count(text: str):
    """The native backend's reading of an ``ETMLX_MAX_*`` limit: its value, or None
    where the backend refuses it (``runtime_shim.limits.parse_byte_count`` is the
    Python runtime's; a test holds the two to one answer)."""
    value = ctypes.c_uint64()
    return value.value if _LIBRARY.etmlx_native_parse_byte_count(text.encode(), ctypes.byref(value)) else None


def take_last_state() -> int:
    """The id of the program state the delegates initialized last on this thread share
    (0 if none since the last call)."""
    return _LIBRARY.etmlx_native_take_last_state()


def _buffer_names(state: int) -> list:
    names = ctypes.c_char_p()
    _checked(_LIBRARY.etmlx_native_state_names(state, ctypes.byref(names)))
    return names.value.decode().splitlines()


def read_state(state: int) -> dict:
    """``{name: (dtype name, numpy array)}`` of program state ``state``'s buffers, as the
    Python runtime's ``ProgramState.snapshot`` gives them."""
    arrays = {}
    for name in _buffer_names(state):
        dtype, rank, data, nbytes = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        shape = (ctypes.c_int64 * 16)()
        _checked(_LIBRARY.etmlx_native_state_read(state, name.encode(), ctypes.byref(dtype), ctypes.byref(rank), shape,
                                                  ctypes.byref(data), ctypes.byref(nbytes)))
        storage = NUMPY_STORAGE[dtype.value]
        raw = ctypes.string_at(data, nbytes.value) if nbytes.value else b""
        arrays[name] = (TORCH_DTYPE_NAMES[dtype.value], np.frombuffer(raw, storage).reshape(list(shape[: rank.value])))
    return arrays


def write_state(state: int, arrays: dict) -> None:
    """Sets program state ``state``'s buffers from ``read_state``'s form: all checked
    first, so a buffer that does not fit changes none (``InputError`` naming it)."""
    check_buffer_names(_buffer_names(state), arrays)
    ir_dtypes = {name: dtype for dtype, name in TORCH_DTYPE_NAMES.items()}
    for check_only in (1, 0):
        for name, (dtype, array) in arrays.items():
            if dtype not in ir_dtypes:
                raise InputError(f"saved buffer {name!r} has dtype {dtype!r}, which etmlx does not know")
            array = np.require(array, NUMPY_STORAGE[ir_dtypes[dtype]], "C")  # ascontiguousarray makes 0-d 1-d
            shape = (ctypes.c_int64 * max(1, array.ndim))(*array.shape)
            _checked(_LIBRARY.etmlx_native_state_write(state, name.encode(), ir_dtypes[dtype], array.ndim, shape,
                                                       array.ctypes.data, array.nbytes, check_only))


def _checked(status: int) -> None:
    if not status:
        raise InputError(last_error_detail()[1])
