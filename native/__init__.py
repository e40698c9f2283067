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

The library is built by ``etmlx build-native`` (``make native`` in a checkout; see
``etmlx/native_build.py``); ``ETMLX_NATIVE_LIBRARY`` names another copy.
"""

from .library import (
    NativeBackendError,
    clear_last_error,
    format_version,
    last_error,
    last_error_detail,
    library_path,
    operations,
)


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
