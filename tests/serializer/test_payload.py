"""The payload reader rejects every damaged payload with an error naming the problem."""

import struct
import zlib

import pytest
import torch

from etmlx.serializer import FORMAT_VERSION, PayloadError, deserialize, node_type, serialize
from etmlx.serializer.generated.etmlx_ir import Binary, Graph, Node, Op, Value
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.ir import tid
from lowering_harness import lower


def _graph(a=0, b=1, out=2, slots=3):
    """inputs 0 and 1, one Add writing ``out``, output ``out``."""
    graph = Graph.GraphT()
    graph.numTensorSlots = slots
    graph.inputs = [_value(0), _value(1)]
    add = Binary.BinaryT()
    add.op, add.a, add.b, add.out = BinaryOp.Add, tid(a), tid(b), tid(out)
    node = Node.NodeT()
    node.opType, node.op = Op.Op.Binary, add
    graph.nodes = [node]
    graph.outputs = [_value(out)]
    return graph


def _without_operand_b():
    graph = _graph()
    graph.nodes[0].op.b = None
    return graph


def _value(slot):
    value = Value.ValueT()
    value.slot = slot
    return value


@pytest.fixture(scope="module")
def real_payload() -> bytes:
    """The payload of an exported model, so the checks run on what export writes."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.softmax(self.linear(x), dim=-1)

    lowered = lower(Model(), (torch.randn(2, 8),))
    from etmlx.runtime_shim.pte_file import read_pte

    pte = read_pte(lowered.pte)
    (delegate,) = pte.program.plans[0].delegates
    return bytes(pte.delegate_data(delegate))


def test_round_trip_keeps_nodes():
    graph = deserialize(serialize(_graph()))
    assert [node_type(n) for n in graph.nodes] == ["Add"]
    assert graph.nodes[0].op.out.idx == 2


def test_real_payload_reads(real_payload):
    graph = deserialize(real_payload)
    assert [node_type(n) for n in graph.nodes] == ["Transpose", "Addmm", "Softmax"]


@pytest.mark.parametrize("keep", [0, 10, 23, 40])
def test_truncated(real_payload, keep):
    with pytest.raises(PayloadError, match="truncated"):
        deserialize(real_payload[:keep])


def test_every_flipped_bit_in_body_is_caught(real_payload):
    body_start = 24
    for position in range(body_start, len(real_payload), 7):
        damaged = bytearray(real_payload)
        damaged[position] ^= 0x10
        with pytest.raises(PayloadError, match="corrupted"):
            deserialize(bytes(damaged))


def test_wrong_magic(real_payload):
    with pytest.raises(PayloadError, match="not an etmlx payload"):
        deserialize(b"XLMX" + real_payload[4:])


def test_newer_version(real_payload):
    newer = real_payload[:4] + struct.pack("<I", FORMAT_VERSION + 1) + real_payload[8:]
    with pytest.raises(PayloadError, match="newer"):
        deserialize(newer)


def _with_valid_checksum(payload: bytes) -> bytes:
    """Re-seals a hand-damaged body so the structural checks, not the checksum, must catch it."""
    body = payload[24:]
    return struct.pack("<4sIQII", b"EMLX", FORMAT_VERSION, len(body), zlib.crc32(body), 0) + body


@pytest.mark.parametrize(
    "graph, message",
    [
        (_graph(a=7), "out of range"),
        (_graph(b=2), "before it is written"),
        (_graph(out=0), "written twice"),
        (_without_operand_b(), r"node 0 \(Binary\): missing operand b$"),
    ],
)
def test_inconsistent_graph_rejected_at_write(graph, message):
    with pytest.raises(PayloadError, match=message):
        serialize(graph)


def _serialized_with_op(op) -> bytes:
    graph = _graph()
    graph.nodes[0].op.op = op
    return serialize(graph)


def test_unknown_enum_rejected_on_read():
    # Sub and Mul (non-default, so both are written) differ in exactly the op byte.
    sub, mul = _serialized_with_op(BinaryOp.Sub), _serialized_with_op(BinaryOp.Mul)
    (position,) = [i for i, (x, y) in enumerate(zip(sub, mul)) if x != y and i >= 24]
    damaged = bytearray(sub)
    damaged[position] = 99
    with pytest.raises(PayloadError, match="unknown BinaryOp 99"):
        deserialize(_with_valid_checksum(bytes(damaged)))


def test_every_ir_dtype_has_its_torch_mlx_and_numpy_forms():
    import numpy as np
    import torch

    from etmlx.lowering.dtypes import TORCH_TO_IR
    from etmlx.runtime_shim.mlx_ops.env import MX_DTYPES
    from etmlx.serializer.ir import DTYPE_NAMES, NUMPY_STORAGE, TORCH_DTYPE_NAMES

    assert set(TORCH_DTYPE_NAMES) == set(DTYPE_NAMES)
    for dtype, name in TORCH_DTYPE_NAMES.items():
        torch_dtype = getattr(torch, name)
        assert TORCH_TO_IR[torch_dtype] == dtype
        assert MX_DTYPES[dtype].size == torch_dtype.itemsize == np.dtype(NUMPY_STORAGE[dtype]).itemsize
        assert str(MX_DTYPES[dtype]) == f"mlx.core.{name}"
