"""etmlx's native backend in this process.

``import etmlx.native`` loads ``libetmlx_backend``, which registers ``EtMlxBackend``
with ExecuTorch's C++ runtime. From then on ExecuTorch's own API runs etmlx programs
unchanged::

    import etmlx.native
    from executorch.runtime import Runtime
    method = Runtime.get().load_program("model.pte").load_method("forward")
    outputs = method.execute([x])

``etmlx.load(path, runtime="executorch")`` does the same behind etmlx's calling
convention (see ``program.py``).

The library is built by ``make native`` (``python native/build.py``) into
``build/native``; ``ETMLX_NATIVE_LIBRARY`` names another copy.
"""

import ctypes
import os
import pathlib

from etmlx.errors import EtMlxError

from .build import DEFAULT_BUILD_DIR, LIBRARY_NAME


class NativeBackendError(EtMlxError, ImportError):
    """The native backend is not built, or does not load."""


def library_path() -> pathlib.Path:
    """Where this process loads the backend from: ``$ETMLX_NATIVE_LIBRARY``, else the
    source tree's build directory."""
    override = os.environ.get("ETMLX_NATIVE_LIBRARY")
    return pathlib.Path(override) if override else DEFAULT_BUILD_DIR / LIBRARY_NAME


def _load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        raise NativeBackendError(
            f"etmlx's native backend is not built ({path} is missing): run `make native` in the etmlx "
            "source tree, or set ETMLX_NATIVE_LIBRARY to a libetmlx_backend you built"
        )
    try:
        library = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise NativeBackendError(f"cannot load etmlx's native backend {path}: {error}") from error
    library.etmlx_native_last_error.restype = ctypes.c_char_p
    library.etmlx_native_last_error_detail.restype = ctypes.c_char_p
    library.etmlx_native_operations.restype = ctypes.c_char_p
    library.etmlx_native_clear_last_error.restype = None
    if not library.etmlx_native_registered():
        raise NativeBackendError(
            "EtMlxBackend did not register with ExecuTorch's runtime (another backend of that name, "
            "or a full registry); see the log above"
        )
    return library


_LIBRARY = _load()


# etmlx::native::ErrorKind (native/src/errors.h)
INDEX_RANGE_ERROR = 4


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


def load(path_or_bytes):
    """A program run by ExecuTorch's C++ runtime; see ``etmlx.load``."""
    from .program import ExecutorchProgram

    return ExecutorchProgram(path_or_bytes)


__all__ = [
    "NativeBackendError",
    "clear_last_error",
    "format_version",
    "last_error",
    "last_error_detail",
    "library_path",
    "load",
    "operations",
]
