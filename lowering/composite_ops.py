"""torch's set of preservable CompositeImplicitAutograd operators, collected once for as
long as the dispatcher's registrations stay the same.

Each ``run_decompositions`` (``to_edge`` runs one per method) asks torch twice for the
CompositeImplicitAutograd operators it could keep whole
(``torch._export.utils._collect_all_valid_cia_ops``), and each time torch walks every
such registration of the C++ dispatcher once per operator namespace, some forty times:
measured, 0.20 of the 0.36 s that lowering a one-layer model takes. torch does not cache
the set because an operator library may register more operators later. Here it is kept
with what it was collected from, the dispatcher's CompositeImplicitAutograd registrations
and torch.ops' namespaces, and collected again when either changes. A Python
decomposition registered later on an existing operator (``py_impl``) is the one change
this does not see; that only moves an operator between kept and decomposed, and both
compute the same values.
"""

import contextlib
import threading

import torch
import torch.export.decomp_utils
import torch.export.exported_program
from torch._export import utils

# The modules that imported torch's function by name, and their copies of it.
_ORIGINALS = {module: module._collect_all_valid_cia_ops for module in (torch.export.exported_program, torch.export.decomp_utils)
              if hasattr(module, "_collect_all_valid_cia_ops")}
_collected: dict = {}  # registrations -> the set torch collected for them (one entry)
_lock = threading.Lock()
_users = 0  # callers inside collected_once(), across threads


def _registrations() -> tuple:
    registered = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    return tuple(registered), tuple(torch.ops._dir)


def _collect_once() -> set:
    with _lock:
        cached = _collected.get(_registrations())
        if cached is None:
            cached = utils._collect_all_valid_cia_ops()
            _collected.clear()
            _collected[_registrations()] = cached  # collecting may add namespaces to torch.ops
        return cached


@contextlib.contextmanager
def collected_once():
    """Inside: torch's decompositions read the set from the cache."""
    global _users
    with _lock:
        if _users == 0:
            for module in _ORIGINALS:
                module._collect_all_valid_cia_ops = _collect_once
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for module, original in _ORIGINALS.items():
                    module._collect_all_valid_cia_ops = original
