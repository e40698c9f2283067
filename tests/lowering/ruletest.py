"""Helpers shared by the per-rule lowering tests.

``delegated`` exports through the full pipeline (``check_parity``) and asserts that
nothing stayed outside MLX. ``lowered_directly`` serves the rules that ExecuTorch's
edge pipeline never reaches today (it decomposes ``silu``, ``t_copy``, ``all``... before
partitioning): it lowers the ATen graph of ``torch.export`` with ``lower_program`` and
runs the payload with the MLX delegate, so those rules are still checked against eager.
"""

import mlx.core as mx
import numpy as np
import pytest
import torch
from executorch.exir._serialize._named_data_store import NamedDataStore
from lowering_harness import assert_close, check_parity, lower

import etmlx.lowering.rules  # noqa: F401  (registers every rule)
from etmlx.lowering.preprocess import lower_program
from etmlx.lowering.registry import RULES
from etmlx.runtime_shim.mlx_delegate import MlxDelegate
from etmlx.runtime_shim.state import ProgramState
from etmlx.serializer import serialize
from etmlx.serializer.ir import node_type

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


# Operators some test in this session saw lowered, for the per-family coverage tests.
DELEGATED: set = set()


class Fn(torch.nn.Module):
    """A module whose forward is ``fn``: one tiny model per test case."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


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
    DELEGATED.update(op for op, entry in lowered.report.operators.items() if entry.delegated)
    return lowered


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


# ---------------------------------------------------------------- direct lowering
def _to_mx(tensor: torch.Tensor) -> mx.array:
    if tensor.dtype == torch.bfloat16:
        return mx.array(tensor.float().numpy()).astype(mx.bfloat16)
    return mx.array(tensor.numpy())


def _to_torch(array: mx.array) -> torch.Tensor:
    if array.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(array.astype(mx.float32))).bfloat16()
    return torch.from_numpy(np.array(array))


class _NamedData:
    def __init__(self, store: NamedDataStore):
        output = store.get_named_data_store_output()
        self._data = {key: output.buffers[entry.buffer_index] for key, entry in output.pte_data.items()}

    def get(self, key):
        return self._data[key]


def lowered_directly(module_or_fn, inputs, nodes=()):
    """Lowers the ATen graph of ``torch.export`` (no edge decompositions) and runs it
    with the MLX delegate; checks parity and returns the IR node types."""
    module = _module(module_or_fn).eval()
    program = torch.export.export(module, tuple(inputs))
    program.graph_module.graph.eliminate_dead_code()  # e.g. the unused indices of a max pool
    store = NamedDataStore()
    graph = lower_program(program, store)
    delegate = MlxDelegate(serialize(graph), _NamedData(store), ProgramState())
    outputs = [_to_torch(o) for o in delegate.run([_to_mx(t) for t in inputs])]
    with torch.no_grad():
        expected = module(*inputs)
    assert_close(outputs if isinstance(expected, (tuple, list)) else outputs[0], expected)
    types = [node_type(n) for n in graph.nodes]
    for node in nodes:
        assert node in types, f"{node} not in {types}"
    DELEGATED.update(
        n.target.name() for n in program.graph.nodes if n.op == "call_function" and hasattr(n.target, "name")
    )
    return types


def untested_rules(family: str) -> set:
    """Rules of ``lowering/rules/<family>.py`` that no test of this session lowered."""
    return {name for name, rule in RULES.items() if rule.lower.__module__.endswith(f".{family}")} - DELEGATED
