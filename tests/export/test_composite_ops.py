"""torch's preservable CompositeImplicitAutograd operators, collected once
(``lowering/composite_ops.py``): the same set torch collects, and collected again once an
operator library registers more."""

import torch
import torch.export.exported_program as exported_program
from torch._export import utils

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
