"""Damaged and inconsistent programs end in one clear error on every runtime — at
load, naming the delegate's method and the problem — never in a crash."""

import struct
import zlib

import pytest
import runtimes
import torch

import etmlx
from etmlx.runtime_shim.errors import ExecutionError, PteFormatError
from etmlx.serializer.generated.etmlx_ir import Graph
from fuzz.corpus import Experts, Rotary
from lowering_harness import lower

HEADER = struct.Struct("<4sIQII")


@pytest.fixture(scope="module")
def pte() -> bytes:
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Softmax(dim=-1))
    return lower(model, (torch.randn(2, 8),)).pte


def _payload_at(data: bytes) -> int:
    return data.index(b"EMLX")


def _patched(pte: bytes, patch) -> bytes:
    """The .pte with its payload's flatbuffer edited in place by ``patch(body, graph)``
    and the checksum made valid again, so the structural checks must catch it."""
    data = bytearray(pte)
    start = _payload_at(data)
    _, version, size, _, _ = HEADER.unpack_from(data, start)
    body_start = start + HEADER.size
    body = bytearray(data[body_start : body_start + size])
    patch(body, Graph.Graph.GetRootAs(body, 0))
    data[body_start : body_start + size] = body
    HEADER.pack_into(data, start, b"EMLX", version, size, zlib.crc32(body), 0)
    return bytes(data)


def _field_position(table, vtable_offset: int) -> int:
    offset = table._tab.Offset(vtable_offset)
    assert offset, "field absent"
    return table._tab.Pos + offset


def _addmm_out(body, graph):
    """The ``out`` slot of the Addmm node (c, a, b, alpha, beta, out -> vtable slot 5)."""
    from etmlx.serializer.generated.etmlx_ir import Addmm
    from etmlx.serializer.generated.etmlx_ir.Op import Op

    (node,) = [graph.Nodes(i) for i in range(graph.NodesLength()) if graph.Nodes(i).OpType() == Op.Addmm]
    table = Addmm.Addmm()
    union = node.Op()
    table.Init(union.Bytes, union.Pos)
    return _field_position(table, 4 + 2 * 5)


def _load_everywhere(data: bytes, match: str) -> None:
    for runtime in runtimes.RUNTIMES:
        with pytest.raises(PteFormatError, match=match):
            etmlx.load(data, runtime=runtime)


def test_flipped_bits_in_a_payload(pte):
    start = _payload_at(pte)
    _, _, size, _, _ = HEADER.unpack_from(pte, start)
    for position in range(start + HEADER.size, start + HEADER.size + size, 11):
        data = bytearray(pte)
        data[position] ^= 0x10
        _load_everywhere(bytes(data), "method 'forward'.*payload corrupted: checksum mismatch")


def test_newer_payload_version(pte):
    data = bytearray(pte)
    struct.pack_into("<I", data, _payload_at(data) + 4, 99)
    _load_everywhere(bytes(data), "payload format version 99 is newer")


def test_unknown_node_type(pte):
    def patch(body, graph):
        body[_field_position(graph.Nodes(0), 4)] = 250  # Node.op_type

    _load_everywhere(_patched(pte, patch), "node 0.*unknown node type 250")


def test_a_node_this_runtime_has_no_handler_for(pte, monkeypatch):
    """A payload using an op the runtime's handlers lack (a runtime older than the schema)."""
    from etmlx.runtime_shim import mlx_delegate

    monkeypatch.delitem(mlx_delegate.HANDLERS, "Softmax")
    with pytest.raises(PteFormatError, match=r"node 2 \(Softmax\): no handler in this runtime"):
        etmlx.load(pte)


def test_slot_out_of_range(pte):
    def patch(body, graph):
        struct.pack_into("<I", body, _addmm_out(body, graph), 1_000_000)

    _load_everywhere(_patched(pte, patch), "tensor slot 1000000 out of range")


def test_slot_written_twice(pte):
    def patch(body, graph):
        struct.pack_into("<I", body, _addmm_out(body, graph), graph.Inputs(0).Slot())

    _load_everywhere(_patched(pte, patch), "written twice")


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_truncated_file(pte, keep):
    for runtime in runtimes.RUNTIMES:
        with pytest.raises(PteFormatError):
            etmlx.load(pte[: int(len(pte) * keep)], runtime=runtime)


def test_slot_count_past_the_limit(pte):
    def patch(body, graph):
        struct.pack_into("<I", body, _field_position(graph, 4), 1 << 30)  # Graph.num_tensor_slots

    _load_everywhere(_patched(pte, patch), "1073741824 tensor slots; at most 16777216")


def test_a_bounds_check_against_a_negative_size():
    """Found by the fuzzer under UBSan: -size overflowed for a size of INT64_MIN."""
    from etmlx.serializer.generated.etmlx_ir import CheckIndex
    from etmlx.serializer.generated.etmlx_ir.Op import Op

    data = lower(torch.nn.Embedding(10, 4), (torch.tensor([[1, 2]]),)).pte

    def patch(body, graph):
        node = next(graph.Nodes(i) for i in range(graph.NodesLength()) if graph.Nodes(i).OpType() == Op.CheckIndex)
        table, union = CheckIndex.CheckIndex(), node.Op()
        table.Init(union.Bytes, union.Pos)
        struct.pack_into("<q", body, _field_position(table, 4 + 2 * 1), -(2**63))  # size.value

    _load_everywhere(_patched(data, patch), "CheckIndex against a negative size")


def test_an_empty_payload_body(pte):
    """Found by the fuzzer under UBSan: the native reader copied from a null pointer."""
    data = bytearray(pte)
    start = _payload_at(data)
    HEADER.pack_into(data, start, b"EMLX", HEADER.unpack_from(data, start)[1], 0, zlib.crc32(b""), 0)
    _load_everywhere(bytes(data), "payload empty")


def test_an_integer_operand_where_pytorch_computes_on_floats_only():
    """Found by the fuzzer under ASan: an embedding's CheckIndex retyped as Variance gave
    the gather the int64 cast of inf, undefined in the code mx.compile generates. Each
    runtime refuses the file or the call; the handlers refuse integer operands."""
    import mlx.core as mx

    from etmlx.runtime_shim.mlx_ops import HANDLERS
    from etmlx.runtime_shim.mlx_ops.env import Env
    from etmlx.serializer.generated.etmlx_ir import Variance
    from etmlx.serializer.generated.etmlx_ir.Op import Op
    from etmlx.serializer.ir import tid

    data = lower(torch.nn.Embedding(10, 4), (torch.tensor([[1, 2]]),)).pte

    def patch(body, graph):
        node = next(graph.Nodes(i) for i in range(graph.NodesLength()) if graph.Nodes(i).OpType() == Op.CheckIndex)
        body[_field_position(node, 4)] = Op.Variance  # Node.op_type

    for runtime in runtimes.RUNTIMES:
        with pytest.raises((PteFormatError, ExecutionError)):
            etmlx.load(_patched(data, patch), runtime=runtime).forward(torch.tensor([[1, 2]]))
    env = Env(2, 0)
    env.tensors[0] = mx.array([[1, 2, 3]], dtype=mx.int64)
    op = Variance.VarianceT()
    op.x, op.axes, op.ddof = tid(0), [], 28
    with pytest.raises(ValueError, match="variance of a tensor that is not floating-point"):
        HANDLERS["Variance"](op, env)


def test_a_plan_without_its_buffer_sizes(pte):
    """Found by the fuzzer: ExecuTorch's Python bindings abort (an assert) on a plan that
    lacks ``non_const_buffer_sizes``; native/plan_checks.py refuses it by name first."""
    from etmlx.runtime_shim.generated.executorch_flatbuffer.Program import Program

    data = bytearray(pte)
    plan = Program.GetRootAs(data, 0).ExecutionPlan(0)
    vtable = plan._tab.Pos - struct.unpack_from("<i", data, plan._tab.Pos)[0]
    struct.pack_into("<H", data, vtable + 20, 0)  # the field's vtable entry: absent
    with pytest.raises(PteFormatError, match="the plan lists no memory-planned buffer sizes"):
        etmlx.load(bytes(data), runtime="executorch")


@pytest.mark.parametrize("field", [3, 4], ids=["inputs", "outputs"])
def test_a_plan_without_its_inputs_or_outputs(pte, field):
    """Found by the fuzzer: ExecuTorch's runtime aborts ("Missing inputs field") on a plan
    whose list of inputs or outputs is absent; both runtimes refuse it by name."""
    from etmlx.runtime_shim.generated.executorch_flatbuffer.Program import Program

    data = bytearray(pte)
    plan = Program.GetRootAs(data, 0).ExecutionPlan(0)
    vtable = plan._tab.Pos - struct.unpack_from("<i", data, plan._tab.Pos)[0]
    struct.pack_into("<H", data, vtable + 4 + 2 * field, 0)  # the field's vtable entry: absent
    _load_everywhere(bytes(data), "the plan lacks its list of inputs or outputs")


@pytest.mark.parametrize("field, value", [(1, 7), (1, 4), (2, "x"), (3, "x")],
                         ids=["odd dims", "dims not the last axis", "offset x", "freqs x"])
def test_a_rope_whose_operands_do_not_fit(field, value):
    """Rope's dims must be x's last axis (even), its offset one integer, its freqs
    dims / 2 float32 values: a file that says otherwise fails by name on every runtime
    (on a GPU MLX's kernel would check the same)."""
    q, start = torch.randn(1, 2, 3, 8), torch.tensor([5])
    data = lower(Rotary(), (q, start)).pte

    def patch(body, graph):
        table = _first_table(graph, "Rope")
        position = _field_position(table, 4 + 2 * field)
        if field == 1:
            struct.pack_into("<i", body, position, value)
        else:  # a Tid struct: its slot, here x's
            struct.pack_into("<I", body, position, table.X().Idx())

    for runtime in runtimes.RUNTIMES:
        with pytest.raises((PteFormatError, ExecutionError), match="rope"):
            etmlx.load(_patched(data, patch), runtime=runtime).forward(q, start)


def _first_table(graph, name: str):
    """The first node of union type ``name`` in ``graph``, as its generated table."""
    import importlib

    from etmlx.serializer.generated.etmlx_ir.Op import Op

    node = next(graph.Nodes(i) for i in range(graph.NodesLength()) if graph.Nodes(i).OpType() == getattr(Op, name))
    table = getattr(importlib.import_module(f"etmlx.serializer.generated.etmlx_ir.{name}"), name)()
    table.Init(node.Op().Bytes, node.Op().Pos)
    return table


def _experts(quantized: bool):
    from etmlx.quant.weights import quantized_copy

    return quantized_copy(Experts(dim=32), "int4", 32)[0] if quantized else Experts(dim=32)


@pytest.mark.parametrize(
    "name, field, wrong",
    [("GatherMm", 1, "RhsIndices"), ("GatherMm", 2, "A"), ("GatherQmm", 1, "RhsIndices"), ("GatherQmm", 4, "X")],
    ids=["gather_mm weights of one dim", "gather_mm float indices", "gather_qmm packed weights of one dim",
         "gather_qmm float indices"],
)
def test_a_gathered_matmul_whose_operands_do_not_fit(name, field, wrong):
    """GatherMm's and GatherQmm's weights must be a stack of (packed) matrices and their
    indices integers (then clamped into the stack): a file whose operand ``field`` reads
    the slot of operand ``wrong`` (1-d indices, float activations) fails by name on every
    runtime."""
    x = torch.randn(5, 32)
    data = lower(_experts(name == "GatherQmm"), (x,)).pte

    def patch(body, graph):
        table = _first_table(graph, name)
        struct.pack_into("<I", body, _field_position(table, 4 + 2 * field), getattr(table, wrong)().Idx())

    what = "gather_qmm" if name == "GatherQmm" else "gather_mm"
    for runtime in runtimes.RUNTIMES:
        with pytest.raises((PteFormatError, ExecutionError), match=what):
            etmlx.load(_patched(data, patch), runtime=runtime).forward(x)


def test_a_growing_buffer_along_an_axis_it_does_not_have(tmp_path):
    """A KV cache declared to grow along axis 9 of its 4: refused at load by name."""
    from examples import llm

    path = tmp_path / "llm.pte"
    etmlx.export_methods(llm.export_methods(llm.tiny_llama(hidden=32, layers=1, max_cache=32), 4, window_step=8), path)

    def patch(body, graph):
        buffer = next(graph.Buffers(i) for i in range(graph.BuffersLength()) if graph.Buffers(i).GrowAxis() == 2)
        struct.pack_into("<i", body, _field_position(buffer, 4 + 2 * 4), 9)  # grow_axis

    _load_everywhere(_patched(path.read_bytes(), patch), "grows along axis 9 of a rank-4 shape")


@pytest.mark.parametrize("operator", ["mod", "floordiv"])
def test_size_arithmetic_that_divides_by_a_stored_zero(operator):
    """Found by the fuzzer: ExecuTorch's integer prim ops trap (SIGFPE) dividing by zero,
    or the least int64 by -1; plan_checks refuses a stored such divisor, not one the
    plan computes (stored as a placeholder 0)."""
    from etmlx.native.plan_checks import _check_divisors
    from etmlx.runtime_shim import pte_types as t

    def plan(values):
        return t.ExecutionPlan("forward", values, (), (2,), [t.KernelCall(0, (0, 1, 2))],
                               [t.Operator(f"executorch_prim::{operator}", "Scalar")], [], (0,))

    for values in ([7, 0, 0], [-(1 << 63), -1, 0]):
        with pytest.raises(PteFormatError, match="divides by a stored"):
            _check_divisors(plan(values), written={2})
    _check_divisors(plan([7, 0, 0]), written={1, 2})  # a divisor computed at run time
    _check_divisors(plan([7, 3, 0]), written={2})
