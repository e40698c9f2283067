"""State of one delegate's lowering: slots, constants, buffers and emitted nodes."""

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import fx

from etmlx.lowering.mapped_pages import release
from etmlx.serializer.generated.etmlx_ir import Graph, MutableBuffer, NamedTensor, Node, Op, Value
from etmlx.serializer.generated.etmlx_ir.ValueKind import ValueKind
from etmlx.serializer.ir import IntOrSlotT, TidT, int_or_slot, tid

from . import deferred
from .dtypes import ir_dtype, tensor_bytes
from .spilled import spilled

CONSTANT_KEY_PREFIX = "etmlx."


def constant_key(sha256: bytes) -> str:
    """Content-addressed key, of the bytes' SHA-256: identical weights share one entry
    across partitions and methods, and two different tensors can never collide on a
    generated name."""
    return CONSTANT_KEY_PREFIX + sha256.hex()[:32]


class LoweringContext:
    """Builds a ``GraphT`` while rules lower fx nodes in order.

    ``constant_values`` holds the export-time value of every constant node, so rules
    can prepare weights for MLX once (transpose, fold) instead of on every call.
    """

    def __init__(self, named_data_store):
        self.graph = Graph.GraphT()
        self.graph.inputs, self.graph.outputs = [], []
        self.graph.constants, self.graph.buffers, self.graph.nodes = [], [], []
        self._store = named_data_store
        self._bytes: dict = {}  # named-data key -> the bytes, stored by ``store_named_data``
        self._tensors: dict = {}  # fx node (or (node, index)) -> TidT
        self._ints: dict = {}  # fx node -> IntOrSlotT
        self.constant_values: dict = ConstantValues()  # fx node -> torch.Tensor
        self._buffers: dict = {}  # buffer placeholder -> MutableBufferT
        self._made_once: dict = {}  # key -> slot (``once``)

    # ------------------------------------------------------------ slots
    def new_tensor(self) -> TidT:
        self.graph.numTensorSlots += 1
        return tid(self.graph.numTensorSlots - 1)

    def new_int(self) -> IntOrSlotT:
        self.graph.numIntSlots += 1
        return int_or_slot(self.graph.numIntSlots - 1, is_slot=True)

    def bind(self, node: fx.Node, ref: TidT, index: Optional[int] = None) -> None:
        """Records that ``node`` (output ``index`` of a multi-output node) lives in ``ref``."""
        self._tensors[node if index is None else (node, index)] = ref

    def slot_ranks(self) -> dict:
        """Tensor slot -> rank, for the slots that hold an fx node's value."""
        ranks = {}
        for key, ref in self._tensors.items():
            node, index = key if isinstance(key, tuple) else (key, None)
            value = node.meta.get("val")
            if index is not None and isinstance(value, (tuple, list)) and index < len(value):
                value = value[index]
            if isinstance(value, torch.Tensor):
                ranks[ref.idx] = value.dim()
        return ranks

    def bind_int(self, node: fx.Node, ref: IntOrSlotT) -> None:
        self._ints[node] = ref

    def tensor(self, node: fx.Node) -> TidT:
        """The slot holding ``node``'s value; a constant is stored on first use."""
        if node not in self._tensors and node in self.constant_values:
            self._tensors[node] = self.add_constant(self.constant_values[node])
        try:
            return self._tensors[node]
        except KeyError:
            raise RuntimeError(f"etmlx lowering: {node.format_node()} has no value yet") from None

    def item(self, node: fx.Node, index: int) -> TidT:
        return self._tensors[(node, index)]

    def size(self, value) -> IntOrSlotT:
        """A literal size, or the int slot of a SymInt-producing node."""
        if isinstance(value, fx.Node):
            return self._ints[value]
        return int_or_slot(int(value))

    def sizes(self, values: Sequence) -> list:
        return [self.size(v) for v in values]

    def is_constant(self, node) -> bool:
        """Whether ``node``'s value is known at export: a frozen placeholder, or a value
        folded from constants during lowering."""
        return isinstance(node, fx.Node) and node in self.constant_values

    def is_buffer(self, node) -> bool:
        """A mutable buffer the delegate owns (``add_buffer``)."""
        return node in self._buffers

    def once(self, key, make):
        """The slot ``make()`` returns, made on the first call with ``key`` (hashable) and
        reused after: for values rules would otherwise compute again, like the same
        indices checked against the same bound for every layer's KV cache."""
        if key not in self._made_once:
            self._made_once[key] = make()
        return self._made_once[key]

    # ------------------------------------------------------------ graph parts
    def emit(self, table, **fields) -> TidT:
        """Appends a node of ``table`` (a generated module, e.g. ``Binary``) and returns the
        slot it writes: a fresh ``out`` tensor slot, or the ``outInt`` passed in."""
        name = table.__name__.rsplit(".", 1)[-1]
        op = getattr(table, name + "T")()
        if "outInt" not in fields:
            fields.setdefault("out", self.new_tensor())
        for key, value in fields.items():
            if not hasattr(op, key):
                raise TypeError(f"{name} has no field {key}")
            setattr(op, key, value)
        node = Node.NodeT()
        node.opType, node.op = getattr(Op.Op, name), op
        self.graph.nodes.append(node)
        return fields["outInt"] if "outInt" in fields else fields["out"]

    def add_input(self, node: fx.Node) -> None:
        if isinstance(node.meta.get("val"), torch.SymInt):
            ref = self.new_int()
            self.bind_int(node, ref)
            self.graph.inputs.append(_value(ValueKind.Int, ref.value))
        else:
            ref = self.new_tensor()
            self.bind(node, ref)
            self.graph.inputs.append(_value(ValueKind.Tensor, ref.idx))

    def add_output(self, node: fx.Node) -> None:
        if node in self._ints:
            self.graph.outputs.append(_value(ValueKind.Int, self._ints[node].value))
        else:
            self.graph.outputs.append(_value(ValueKind.Tensor, self.tensor(node).idx))

    def add_constant(self, value) -> TidT:
        """A slot holding ``value``, a tensor or its ``Stored`` form; a large one's bytes kept
        in a file until the program is written, where a block asks for that (``spilled``)."""
        ref = self.new_tensor()
        self.graph.constants.append(self._named_tensor(ref, value, spill=True))
        return ref

    def store_named_data(self) -> None:
        """Writes the bytes of the constants and buffers the graph holds, once it is
        final: a weight a fusion replaced (the expert stacks ``gather_mm`` stores
        transposed, say) is then not written into the .pte as well."""
        for named in list(self.graph.constants) + [buffer.initial for buffer in self.graph.buffers]:
            if named.key:  # a growing buffer's zeros are not stored
                self._store.add_named_data(named.key, self._bytes[named.key])

    def holds_zeros(self, named) -> bool:
        """Whether the constant or buffer value ``named`` is all zeros."""
        return not self._bytes[named.key].strip(b"\0")

    def add_buffer(self, node: fx.Node, name: str, initial: torch.Tensor) -> None:
        ref = self.new_tensor()
        buffer = MutableBuffer.MutableBufferT()
        buffer.initial, buffer.name = self._named_tensor(ref, initial), name
        self.graph.buffers.append(buffer)
        self._buffers[node] = buffer
        self.bind(node, ref)

    def update_buffer(self, buffer_node: fx.Node, value_node: fx.Node) -> None:
        buffer = self._buffers[buffer_node]
        buffer.update, buffer.hasUpdate = self.tensor(value_node).idx, True

    def _named_tensor(self, ref: TidT, value, spill: bool = False):
        constant = value if isinstance(value, Stored) else stored(value)
        if constant.key not in self._bytes:  # the same bytes (their key is their hash): written once
            self._bytes[constant.key] = spilled(constant.data, constant.sha256) if spill else constant.data
        named = NamedTensor.NamedTensorT()
        named.slot, named.key = ref.idx, constant.key
        named.dtype, named.shape = constant.dtype, list(constant.shape)
        return named


@dataclass(frozen=True)
class Stored:
    """A constant as the program stores it (``stored``): its bytes (or ExecuTorch's
    ``FileBackedData``, a file holding them), their SHA-256, its IR dtype and shape.
    ``add_constant`` takes one in place of the tensor: one made in another process
    (``etmlx/quant/pack_worker.py``) comes so."""

    data: object
    sha256: bytes
    dtype: int
    shape: tuple

    @property
    def key(self) -> str:
        return constant_key(self.sha256)


def stored(value: torch.Tensor) -> Stored:
    data = tensor_bytes(value)
    release(value)  # a weight stored as it was loaded: its pages of the checkpoint
    return Stored(data, hashlib.sha256(data).digest(), ir_dtype(value.dtype), tuple(value.shape))


class ConstantValues(dict):
    """fx node -> its value at export, a deferred constant computed as it is read
    (``lowering/deferred.py``): only the weight a rule is packing is ever held whole."""

    def __getitem__(self, node):
        return deferred.resolve(super().__getitem__(node))

    def unresolved(self, node):
        """``node``'s constant as it was given: a deferred one not computed."""
        return super().__getitem__(node)

    def get(self, node, default=None):
        return self[node] if node in self else default


def _value(kind: int, slot: int):
    value = Value.ValueT()
    value.kind, value.slot = kind, slot
    return value
