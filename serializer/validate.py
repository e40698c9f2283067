"""Structural checks of a ``GraphT``: every slot index in range, every enum known,
every slot written exactly once and before it is read.

The checks read fields by the schema's conventions (see schema.fbs): a ``TidT`` or
``IntOrSlotT`` named ``out``/``outInt`` is written, any other is read; an optional
operand ``x`` is absent when the table's ``hasX`` is false; ``op`` is the table's
``<Table>Op`` enum and ``dtype`` a ``DType``. So a new node table needs no code here.
"""

from .constants import MAX_SLOTS
from .errors import PayloadError
from .generated.etmlx_ir.ValueKind import ValueKind
from .ir import DTYPE_NAMES, OP_NAMES, WRITTEN_FIELDS, IntOrSlotT, TidT, enum_names, missing_operands, op_enum, read_operands


class _Slots:
    def __init__(self, kind: str, count: int):
        self.kind, self.count, self.written = kind, count, set()

    def _check_range(self, idx: int, where: str) -> None:
        if not 0 <= idx < self.count:
            raise PayloadError(f"{where}: {self.kind} slot {idx} out of range (graph has {self.count})")

    def write(self, idx: int, where: str) -> None:
        self._check_range(idx, where)
        if idx in self.written:
            raise PayloadError(f"{where}: {self.kind} slot {idx} written twice")
        self.written.add(idx)

    def read(self, idx: int, where: str) -> None:
        self._check_range(idx, where)
        if idx not in self.written:
            raise PayloadError(f"{where}: reads {self.kind} slot {idx} before it is written")


def validate(graph) -> None:
    for kind, count in (("tensor", graph.numTensorSlots), ("int", graph.numIntSlots)):
        if count > MAX_SLOTS:
            raise PayloadError(f"graph declares {count} {kind} slots; at most {MAX_SLOTS}")
    tensors = _Slots("tensor", graph.numTensorSlots)
    ints = _Slots("int", graph.numIntSlots)
    slots_of_kind = {ValueKind.Tensor: tensors, ValueKind.Int: ints}
    for i, value in enumerate(graph.inputs or []):
        if value.kind not in slots_of_kind:
            raise PayloadError(f"input {i}: unknown value kind {value.kind}")
        slots_of_kind[value.kind].write(value.slot, f"input {i}")
    for i, constant in enumerate(graph.constants or []):
        _check_named_tensor(constant, tensors, f"constant {i}")
    size_inputs = {v.slot for v in graph.inputs or [] if v.kind == ValueKind.Int}
    for i, buffer in enumerate(graph.buffers or []):
        if buffer.initial is None or not buffer.name:
            raise PayloadError(f"buffer {i}: missing initial value or name")
        _check_growth(buffer, size_inputs, f"buffer {i}")
        _check_named_tensor(buffer.initial, tensors, f"buffer {i}", stored=buffer.growAxis < 0)
    for i, node in enumerate(graph.nodes or []):
        _check_node(node, i, tensors, ints)
    for i, buffer in enumerate(graph.buffers or []):
        if buffer.hasUpdate:
            tensors.read(buffer.update, f"buffer {i} update")
    for i, value in enumerate(graph.outputs or []):
        if value.kind not in slots_of_kind:
            raise PayloadError(f"output {i}: unknown value kind {value.kind}")
        slots_of_kind[value.kind].read(value.slot, f"output {i}")


def _check_growth(buffer, size_inputs: set, where: str) -> None:
    """A growing buffer's axis lies in its shape and its extent is an integer input."""
    if buffer.growAxis < 0:
        return
    rank = len(buffer.initial.shape or [])
    if buffer.growAxis >= rank:
        raise PayloadError(f"{where}: grows along axis {buffer.growAxis} of a rank-{rank} shape")
    if buffer.growExtent not in size_inputs:
        raise PayloadError(f"{where}: grows to int slot {buffer.growExtent}, which is no integer input")
    if buffer.initial.key:
        raise PayloadError(f"{where}: a growing buffer starts as zeros, but names stored data")


def _check_named_tensor(tensor, tensors: _Slots, where: str, stored: bool = True) -> None:
    if stored and not tensor.key:
        raise PayloadError(f"{where}: missing data key")
    _check_dtype(tensor.dtype, where)
    if any(size < 0 for size in tensor.shape or []):
        raise PayloadError(f"{where}: negative size in shape {list(tensor.shape)}")
    tensors.write(tensor.slot, where)


def _check_dtype(dtype: int, where: str) -> None:
    if dtype not in DTYPE_NAMES:
        raise PayloadError(f"{where}: unknown dtype {dtype}")


def _check_node(node, index: int, tensors: _Slots, ints: _Slots) -> None:
    table = OP_NAMES.get(node.opType)
    if table is None or node.op is None:
        raise PayloadError(f"node {index}: unknown node type {node.opType}")
    where = f"node {index} ({table})"
    fields = vars(node.op)
    if "op" in fields and fields["op"] not in enum_names(op_enum(table)):
        raise PayloadError(f"{where}: unknown {table}Op {fields['op']}")
    if "dtype" in fields:
        _check_dtype(fields["dtype"], where)
    missing = missing_operands(table, node.op)
    if missing:
        raise PayloadError(f"{where}: missing operand {', '.join(missing)}")
    for name, item in read_operands(node.op):
        if isinstance(item, TidT):
            tensors.read(item.idx, f"{where} {name}")
        else:
            ints.read(item.value, f"{where} {name}")
    writes = [(name, value) for name, value in fields.items() if name in WRITTEN_FIELDS]
    if not writes:
        raise PayloadError(f"{where}: writes no slot")
    for name, value in writes:
        if name == "out" and isinstance(value, TidT):
            tensors.write(value.idx, where)
        elif name == "outInt" and isinstance(value, IntOrSlotT) and value.isSlot:
            ints.write(value.value, where)
        else:
            raise PayloadError(f"{where}: missing result slot")
