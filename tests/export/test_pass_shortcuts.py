"""Work ExecuTorch's passes would do for nothing, skipped while etmlx lowers
(``lowering/edge_passes.py``): passes with nothing to rewrite, retraces of a graph that one
retrace does the rewrites of, and the fake run of a whole delegated graph for outputs its
trace already has. The file is byte for byte the one
ExecuTorch's own way writes."""

import contextlib

import torch
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.pass_base import ExportPass
from torch._subclasses.fake_tensor import FakeTensorMode

import etmlx
from etmlx.lowering import edge_passes
from examples import llm


def _export(path):
    model = llm.tiny_llama(max_cache=64, layers=1)
    # forward's logits are [1, vocab] (static), verify's [1, n, vocab] (n dynamic)
    return etmlx.export_methods(llm.export_methods(model, 4, verify=True), path)


def test_the_file_is_the_one_without_the_shortcuts(tmp_path, monkeypatch):
    ran_again = []
    table = executorch_call_delegate.python_key_table
    fake_kernel = table[FakeTensorMode]

    def counted(mode, lowered_module, *args):
        ran_again.append(lowered_module.original_module.graph_signature.user_outputs)
        return fake_kernel(mode, lowered_module, *args)

    monkeypatch.setitem(table, FakeTensorMode, counted)
    retraced = []
    retrace = ExportPass.call
    monkeypatch.setattr(ExportPass, "call", lambda self, graph: retraced.append(type(self).__name__) or
                        retrace(self, graph))
    _export(tmp_path / "shortcuts.pte")
    assert len(ran_again) == 1  # verify's delegate, of a dynamic output; forward's taken from its trace
    one_at_a_time = {"ScalarToTensorPass", "SymToTensorPass", "RemoveMixedTypeOperators", "OpReplacePass",
                     "MemoryFormatOpsPass"}
    assert retraced.count("OneRetrace") == 2 and not one_at_a_time & set(retraced)  # once per method

    for shortcut in ("passes_skipped_where_nothing_to_rewrite", "rewrites_in_one_retrace",
                     "delegate_outputs_from_their_trace"):
        monkeypatch.setattr(edge_passes, shortcut, contextlib.nullcontext)
    ran_again.clear()
    _export(tmp_path / "executorch.pte")
    assert len(ran_again) == 4  # each delegate, by SpecPropPass and by LegalizePortableDimOrderPass
    assert (tmp_path / "shortcuts.pte").read_bytes() == (tmp_path / "executorch.pte").read_bytes()


def _graph(function):
    """``function`` traced, its input given a fake value as ExecuTorch's passes expect."""
    graph = torch.fx.symbolic_trace(function)
    with FakeTensorMode() as mode:
        for node in graph.graph.nodes:
            if node.op == "placeholder":
                node.meta["val"] = mode.from_tensor(torch.randn(2, 3))
    return graph


def test_a_pass_with_something_to_rewrite_still_runs():
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass

    with edge_passes.passes_skipped_where_nothing_to_rewrite():
        kept = NormalizeTransposePass().call(_graph(lambda x: x + 1))
        rewritten = NormalizeTransposePass().call(_graph(lambda x: torch.ops.aten.t.default(x) + 1))
    assert not kept.modified
    assert any(node.target is torch.ops.aten.t_copy.default for node in rewritten.graph_module.graph.nodes)
