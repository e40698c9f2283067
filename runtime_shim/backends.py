"""Registry of runtime backends that execute a program's DelegateCalls.

A backend registers a factory under the id its delegates carry in the ``.pte``
(``BackendDelegate.id``, the ahead-of-time backend's class name)::

    register_backend("EtMlxBackend", factory)
    factory(processed: bytes-like, compile_specs: dict[str, bytes],
            named_data: NamedDataLookup, state: ProgramState) -> DelegateHandle

The factory runs once per delegate when a program is loaded, so a handle's state
lives as long as that loaded program; ``state`` is shared by every delegate of the
program (mutable buffers by name, so a KV cache outlives the method that wrote it). ``handle.execute(args)``
gets the DelegateCall's arguments in order, inputs first, then outputs, exactly
as ExecuTorch passes them: tensors as ``TensorValue`` (write outputs in place with
``.set``), everything else as Python values.
"""

import importlib
from typing import Callable, Optional, Protocol

from etmlx.serializer.constants import BACKEND_ID

from .errors import BackendError
from .pte_file import NamedDataLookup
from .state import ProgramState


class DelegateHandle(Protocol):
    def execute(self, args: list) -> Optional[dict]:
        """Runs on ``args`` (inputs, then outputs written in place); returns the integer
        outputs by argument position, for the plan to store, or None."""


BackendFactory = Callable[[memoryview, dict, NamedDataLookup, ProgramState], DelegateHandle]

_FACTORIES: dict[str, BackendFactory] = {}

# Backends whose module registers itself on import; imported on first use so the
# runtime does not pay for (or require) them when a program has no such delegate.
_SELF_REGISTERING = {BACKEND_ID: "etmlx.runtime_shim.mlx_delegate"}


def register_backend(backend_id: str, factory: BackendFactory) -> None:
    """Register (or replace) the factory for delegates with id ``backend_id``."""
    _FACTORIES[backend_id] = factory


def registered_backends() -> list[str]:
    return sorted(_FACTORIES)


def _factory(backend_id: str) -> BackendFactory:
    module = _SELF_REGISTERING.get(backend_id)
    if backend_id not in _FACTORIES and module is not None:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
    try:
        return _FACTORIES[backend_id]
    except KeyError:
        raise BackendError(
            f"no runtime backend registered for delegate id {backend_id!r}"
            f" (registered: {', '.join(registered_backends()) or 'none'})"
        ) from None


def create_handle(
    backend_id: str, processed, compile_specs: dict, named_data: NamedDataLookup, state: ProgramState
) -> DelegateHandle:
    """Initialize one delegate of a loaded program with its registered backend."""
    return _factory(backend_id)(processed, compile_specs, named_data, state)
