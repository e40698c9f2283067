"""torch's bookkeeping around CompositeImplicitAutograd operators, done once per change
rather than on every decomposition.

Each ``run_decompositions`` (``to_edge`` runs one per method) does two things that cost
more than decomposing a small graph does:

- it asks torch twice for the CompositeImplicitAutograd operators it could keep whole
  (``torch._export.utils._collect_all_valid_cia_ops``), and each time torch walks every
  such registration of the C++ dispatcher once per operator namespace, some forty times:
  measured, 0.20 of the 0.36 s that lowering a one-layer model takes. torch does not cache
  the set because an operator library may register more operators later. Here it is kept
  with what it was collected from, the dispatcher's CompositeImplicitAutograd registrations
  and torch.ops' namespaces, and collected again when either changes. A Python
  decomposition registered later on an existing operator (``py_impl``) is the one change
  this does not see; that only moves an operator between kept and decomposed, and both
  compute the same values.
- it overrides the Python kernels of each of those ~560 operators for the trace and puts
  them back after (``_override_composite_implicit_decomp``), through ``OpOverload.py_impl``,
  whose nested function's annotations build two ``typing`` aliases on every one of its
  ~12,000 calls: 0.07-0.15 s per decomposition, 84 of the 130 s the lowering tests spend in
  ``run_decompositions``. ``_override`` makes the same registrations, in the same order, by
  writing the operators' tables directly (``tests/export/test_composite_ops.py`` compares
  the tables both leave, inside and after).
"""

import contextlib
import functools
import threading

import torch
import torch.export.decomp_utils
import torch.export.exported_program
from torch._export import utils
from torch._higher_order_ops.utils import autograd_not_implemented
from torch._subclasses.fake_impls import _deregister_op_impl, _is_op_registered_to_fake_rule, register_op_impl

_program = torch.export.exported_program
# The modules that imported torch's function by name, and their copies of it.
_ORIGINALS = {module: module._collect_all_valid_cia_ops for module in (_program, torch.export.decomp_utils)
              if hasattr(module, "_collect_all_valid_cia_ops")}
_ORIGINAL_OVERRIDE = _program._override_composite_implicit_decomp
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
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


def _run_composite(fake_mode, op, *args, original_callable, **kwargs):
    """The fake-tensor rule torch registers for a kept operator: its own composite."""
    with fake_mode:
        return original_callable(*args, **kwargs)


@contextlib.contextmanager
def _override(composites: dict):
    """torch 2.13's ``_override_composite_implicit_decomp(composites)``: each operator's
    autograd keys refuse autograd, its CompositeImplicitAutograd key runs
    ``composites[op]``, its backend keys and (where it has none) its fake-tensor rule run
    its original composite; all put back on the way out."""
    saved = {}
    for op, composite in composites.items():
        kernels = op.py_kernels
        saved[op] = kernels.copy()
        for key in _program._AUTOGRAD_ALIAS_BACKEND_KEYS_TO_OVERRIDE:
            if key not in kernels:
                kernels[key] = autograd_not_implemented(op, deferred_error=True)
        original = utils._get_decomp_for_cia(op)  # reads the kernel it replaces next
        kernels.pop(_COMPOSITE, None)
        kernels[_COMPOSITE] = composite
        if not _is_op_registered_to_fake_rule(op):
            register_op_impl(op)(functools.partial(_run_composite, original_callable=original))
        for key in _program._BACKEND_KEYS_TO_OVERRIDE:
            if key not in kernels:
                kernels[key] = original
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, kernels in saved.items():
            op.py_kernels.clear()
            op.py_kernels.update(kernels)
            op._dispatch_cache.clear()
            _deregister_op_impl(op)


@contextlib.contextmanager
def collected_once():
    """Inside: torch's decompositions read the set from the cache, and override the
    operators' kernels without ``py_impl``'s cost."""
    global _users
    with _lock:
        if _users == 0:
            for module in _ORIGINALS:
                module._collect_all_valid_cia_ops = _collect_once
            _program._override_composite_implicit_decomp = _override
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for module, original in _ORIGINALS.items():
                    module._collect_all_valid_cia_ops = original
                _program._override_composite_implicit_decomp = _ORIGINAL_OVERRIDE
