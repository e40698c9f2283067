"""torch's bookkeeping around CompositeImplicitAutograd operators, done once
(``lowering/composite_ops.py``): the same set of preservable operators torch collects,
collected again once an operator library registers more; the same kernel overrides torch
makes for a decomposition, and put back alike."""

import functools

import torch
import torch.export.exported_program as exported_program
from torch._export import utils

from torch._subclasses import fake_impls

from etmlx.lowering import composite_ops


def test_the_cached_set_is_torchs_and_follows_new_registrations():
    original = exported_program._collect_all_valid_cia_ops
    with composite_ops.collected_once():
        assert exported_program._collect_all_valid_cia_ops is not original
        first = exported_program._collect_all_valid_cia_ops()
        assert first == utils._collect_all_valid_cia_ops()
        assert exported_program._collect_all_valid_cia_ops() is first  # not collected again

        library = torch.library.Library("etmlx_test_cia", "DEF")
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
        again = exported_program._collect_all_valid_cia_ops()
        assert again is not first and torch.ops.etmlx_test_cia.twice.default in again
    assert exported_program._collect_all_valid_cia_ops is original


def test_an_export_inside_computes_what_it_did_without():
    from executorch.exir import to_edge

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x).flatten(1) @ torch.ones(12, 3)

    program = torch.export.export(Model(), (torch.randn(2, 3, 4),))
    plain = to_edge(program).exported_program()
    with composite_ops.collected_once():
        cached = to_edge(program).exported_program()
    assert str(cached.graph) == str(plain.graph)


def _described(kernel):
    """A kernel as what it runs: the functions a decomposition installs are made afresh
    each time, so they compare by name and bound arguments."""
    if isinstance(kernel, functools.partial):
        bound = tuple(sorted((name, _described(value)) for name, value in kernel.keywords.items()))
        return "partial", _described(kernel.func), bound
    if kernel is composite_ops._run_composite:
        return "the fake rule running the composite"  # torch's is a function local to its override
    if getattr(kernel, "__qualname__", "").endswith("_force_dispatch_to_orig_cia_callable"):
        return "the fake rule running the composite"
    if isinstance(kernel, torch._ops.OpOverload) or not callable(kernel):
        return kernel
    return kernel.__qualname__ if "<locals>" in kernel.__qualname__ else kernel


def _tables(operators) -> list:
    """Each operator's Python kernels, in order, and its fake-tensor rule."""
    return [(op, [(key, _described(kernel)) for key, kernel in op.py_kernels.items()],
             _described(fake_impls.op_implementations_dict.get(op))) for op in operators]


def test_the_override_makes_torchs_registrations_and_puts_them_back():
    from executorch.exir.tracer import _default_decomposition_table

    with composite_ops.collected_once():
        composites, _ = exported_program._split_decomp_table_to_cia_and_python_decomp(_default_decomposition_table())
    assert len(composites) > 100
    before = _tables(composites)
    with composite_ops._ORIGINAL_OVERRIDE(composites):
        torchs = _tables(composites)
    assert _tables(composites) == before
    with composite_ops._override(composites):
        ours = _tables(composites)
    assert ours == torchs and ours != before
    assert _tables(composites) == before
