"""Helpers shared by the per-rule lowering tests.

``delegated`` exports through the full pipeline (``check_parity``) and asserts that
nothing stayed outside MLX. ``lowered_directly`` serves the rules that ExecuTorch's
edge pipeline never reaches today (it decomposes ``silu``, ``t_copy``, ``all``... before
partitioning): it exports with those operators kept whole, so they are still checked
against eager, on every runtime.
"""

import pytest
import torch
from lowering_harness import Fn, Lowered, assert_close, check_parity, checked_in_this_file, lower, record_checked

import etmlx.lowering.rules  # noqa: F401  (registers every rule)
from etmlx.inspection import inspect_program
from etmlx.lowering.registry import RULES

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}



def dtype_shape_cases(shapes, dtypes=FLOATS):
    """Pairs that cover every dtype and every shape once each, not their product: an
    export costs most of a second, and the rules do not mix dtype with shape."""
    count = max(len(shapes), len(dtypes))
    return [
        pytest.param(dtypes[i % len(dtypes)], shapes[i % len(shapes)], id=f"{_dtype_id(dtypes[i % len(dtypes)])}-{shapes[i % len(shapes)]}")
        for i in range(count)
    ]


def _dtype_id(dtype) -> str:
    return DTYPE_IDS.get(dtype, str(dtype).replace("torch.", ""))


def _module(module_or_fn):
    return module_or_fn if isinstance(module_or_fn, torch.nn.Module) else Fn(module_or_fn)


def _dynamic_shapes(module, dynamic_shapes):
    """``Fn.forward`` takes ``*args``: torch.export wants its specs under that name."""
    if dynamic_shapes is not None and isinstance(module, Fn):
        return {"args": tuple(dynamic_shapes)}
    return dynamic_shapes


def delegated(module_or_fn, inputs, nodes=(), exact=None, dynamic_shapes=None, **kwargs):
    """``check_parity`` plus: nothing left outside MLX, and the expected IR nodes ran."""
    module = _module(module_or_fn)
    lowered = check_parity(module, tuple(inputs), _dynamic_shapes(module, dynamic_shapes), **kwargs)
    assert lowered.kernels == [], f"left outside MLX: {lowered.kernels}\n{lowered.report.to_text()}"
    if exact is not None:
        assert lowered.nodes == exact
    for node in nodes:
        assert node in lowered.nodes, f"{node} not in {lowered.nodes}"
    return lowered


def declined_reason(module_or_fn, inputs, operator):
    """Why ``operator`` stays outside MLX, from the report alone: for an operator that
    ExecuTorch's runtime has no kernel for either, so the program runs nowhere here."""
    report = lower(_module(module_or_fn).eval(), tuple(inputs)).report
    entry = report.operators[operator]
    assert entry.declined and not entry.delegated, report.to_text()
    return entry.declined[0][1]


def declined(module_or_fn, inputs, operator, dynamic_shapes=None):
    """``operator`` stays outside MLX (with a reason in the report), yet the .pte matches
    eager; returns the reason. Compared with torch's default tolerances per dtype, since
    the harness has none for float64."""
    module = _module(module_or_fn).eval()
    lowered = lower(module, tuple(inputs), _dynamic_shapes(module, dynamic_shapes))
    with torch.no_grad():
        torch.testing.assert_close(lowered.program.forward(*inputs), module(*inputs))
    entry = lowered.report.operators[operator]
    assert entry.declined and not entry.delegated, lowered.report.to_text()
    assert lowered.kernels, "expected a kernel outside MLX"
    return entry.declined[0][1]


# ---------------------------------------------------------------- whole ATen operators
def edge_whole(module: torch.nn.Module, inputs) -> tuple:
    """The edge program with every operator of the graph kept whole (``preserve_ops``),
    so that each reaches the partitioner as called, whatever ExecuTorch would decompose;
    and the operators kept."""
    from etmlx.pipeline import edge_program

    program = torch.export.export(module, tuple(inputs))
    program.graph_module.graph.eliminate_dead_code()  # e.g. the unused indices of a max pool
    operators = [n.target for n in program.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]
    return edge_program(program, preserve_ops=operators), operators


def lower_whole(module: torch.nn.Module, inputs) -> tuple:
    """``edge_whole`` through the partitioner to a .pte: what was lowered, and the
    operators kept."""
    from etmlx.partitioner import MlxPartitioner

    edge, operators = edge_whole(module, inputs)
    partitioner = MlxPartitioner()
    pte = edge.to_backend(partitioner).to_executorch().buffer
    return Lowered(inspect_program(pte), partitioner.report, pte), operators


def lowered_directly(module_or_fn, inputs, nodes=()):
    """``lower_whole``, so the rules that ExecuTorch's edge pipeline never reaches today
    are checked against eager, on every runtime, like the rest; returns the IR node types."""
    module = _module(module_or_fn).eval()
    lowered, operators = lower_whole(module, inputs)
    assert lowered.kernels == [], f"left outside MLX: {lowered.kernels}\n{lowered.report.to_text()}"
    with torch.no_grad():
        expected = module(*inputs)
    outputs = lowered.program.forward(*inputs)
    assert_close(outputs, expected)
    for node in nodes:
        assert node in lowered.nodes, f"{node} not in {lowered.nodes}"
    record_checked(str(op.name()) for op in operators)
    return lowered.nodes


def untested_rules(family: str) -> set:
    """Rules of ``lowering/rules/<family>.py`` that no test of the calling test's file
    lowered and checked against eager."""
    return {name for name, rule in RULES.items() if rule.lower.__module__.endswith(f".{family}")} - checked_in_this_file()
