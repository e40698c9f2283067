"""ExecuTorch's Python runtime (``executorch.runtime``), imported without its AOT stack.

The executorch 1.5.1 wheel's ``portable_lib`` imports ``executorch.exir._warnings`` for
one warning class, and importing that runs ``executorch.exir``'s package init: the whole
export toolchain (the edge dialect's YAML, dynamo, inductor), about 4 of the 5.5 seconds a
process that only runs programs spends importing. Where ``executorch.exir`` is not loaded
yet, that one leaf module (it imports only ``typing`` and ``typing_extensions``) is loaded
by itself under its own name, behind a placeholder parent that is removed once the runtime
is in: a later ``import executorch.exir`` runs its init as usual and finds the same
``_warnings`` module, so every warning class stays one object.
"""

import importlib.util
import os
import sys
import types

_EXIR = "executorch.exir"
_WARNINGS = "executorch.exir._warnings"


def runtime():
    """``executorch.runtime.Runtime``."""
    if "executorch.runtime" not in sys.modules and _EXIR not in sys.modules:
        _load_warnings_alone()
    from executorch.runtime import Runtime

    return Runtime


def _load_warnings_alone() -> None:
    import executorch

    directory = os.path.dirname(importlib.util.find_spec(_EXIR).origin)  # finds, does not run, its init
    placeholder = types.ModuleType(_EXIR)
    placeholder.__path__ = [directory]
    sys.modules[_EXIR] = placeholder
    try:
        if _WARNINGS not in sys.modules:
            spec = importlib.util.spec_from_file_location(_WARNINGS, os.path.join(directory, "_warnings.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[_WARNINGS] = module
            spec.loader.exec_module(module)
        placeholder._warnings = sys.modules[_WARNINGS]
        import executorch.runtime  # noqa: F401
    finally:
        if sys.modules.get(_EXIR) is placeholder:
            del sys.modules[_EXIR]
        if getattr(executorch, "exir", None) is placeholder:
            del executorch.exir
