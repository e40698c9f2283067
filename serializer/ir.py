"""Names and helpers over the generated IR classes, shared by writer, reader and tools."""

import pathlib
import re

import numpy as np

from .generated.etmlx_ir import DType as _dtype
from .generated.etmlx_ir import Op as _op
from .generated.etmlx_ir.QuantMode import QuantMode
from .generated.etmlx_ir import IntOrSlot as _int_or_slot
from .generated.etmlx_ir import Tid as _tid


def enum_names(enum_class) -> dict:
    """``{value: name}`` of a generated enum class."""
    return {value: name for name, value in vars(enum_class).items() if not name.startswith("_")}


OP_NAMES = {value: name for value, name in enum_names(_op.Op).items() if name != "NONE"}
DTYPE_NAMES = enum_names(_dtype.DType)
QUANT_MODE_NAMES = {value: name.lower() for value, name in enum_names(QuantMode).items()}  # MLX's: "affine", ...
# The one table of IR dtypes: each by torch's name for it (torch.<name>); the lowering
# and the Python runtime derive their torch, mlx and numpy tables from it.
TORCH_DTYPE_NAMES = {
    _dtype.DType.Bool: "bool",
    _dtype.DType.UInt8: "uint8",
    _dtype.DType.Int8: "int8",
    _dtype.DType.Int16: "int16",
    _dtype.DType.Int32: "int32",
    _dtype.DType.Int64: "int64",
    _dtype.DType.Float16: "float16",
    _dtype.DType.BFloat16: "bfloat16",
    _dtype.DType.Float32: "float32",
    _dtype.DType.UInt32: "uint32",
}

# How a constant's bytes are laid out in the .pte; bfloat16 as its 16-bit pattern.
NUMPY_STORAGE = {
    dtype: np.dtype(np.uint16 if name == "bfloat16" else name) for dtype, name in TORCH_DTYPE_NAMES.items()
}

TidT = _tid.TidT
IntOrSlotT = _int_or_slot.IntOrSlotT


def tid(idx: int) -> TidT:
    ref = TidT()
    ref.idx = idx
    return ref


def int_or_slot(value: int, is_slot: bool = False) -> IntOrSlotT:
    ref = IntOrSlotT()
    ref.value = value
    ref.isSlot = is_slot
    return ref


WRITTEN_FIELDS = ("out", "outInt")


def _table_field_types() -> dict:
    """``{table: {field: type}}`` read from schema.fbs, fields named as the object API
    names them (``has_mask`` -> ``hasMask``): the generated Python has no type
    information, and the validator must tell a missing operand from an empty field."""
    text = re.sub(r"//[^\n]*", "", pathlib.Path(__file__).with_name("schema.fbs").read_text())
    camel = lambda name: re.sub(r"_(\w)", lambda m: m.group(1).upper(), name)  # noqa: E731
    return {
        table: {camel(field): kind for field, kind in re.findall(r"(\w+)\s*:\s*(\[?\w+\]?)", body)}
        for table, body in re.findall(r"\btable\s+(\w+)\s*\{([^}]*)\}", text)
    }


FIELD_TYPES = _table_field_types()


def missing_operands(table: str, op) -> list:
    """The operand fields (``Tid``, ``IntOrSlot``) a node table ``op`` reads but lacks."""
    fields = vars(op)
    return [
        name
        for name, kind in FIELD_TYPES.get(table, {}).items()
        if kind in ("Tid", "IntOrSlot")
        and name not in WRITTEN_FIELDS
        and fields.get(name) is None
        and fields.get("has" + name[:1].upper() + name[1:], True) is not False
    ]


def read_operands(op):
    """Yields ``(field name, TidT | IntOrSlotT)`` for every slot the node table ``op``
    reads, by the schema's conventions: ``out``/``outInt`` are written, not read; an
    operand ``x`` is absent when the table has ``hasX`` false; literal sizes are skipped."""
    fields = vars(op)
    for name, value in fields.items():
        if name in WRITTEN_FIELDS or fields.get("has" + name[:1].upper() + name[1:], True) is False:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, TidT) or (isinstance(item, IntOrSlotT) and item.isSlot):
                yield name, item


def node_type(node) -> str:
    """The IR name of a node (``"Add"`` for a Binary add, ``"Sdpa"``, ...).

    Family tables (Unary, Binary, Reduce, ...) report their ``op`` member, so
    inspect and the tests see the MLX operation, not the table that carries it.
    """
    table = OP_NAMES[node.opType]
    operation = getattr(node.op, "op", None)
    if operation is None:
        return table
    return enum_names(op_enum(table))[operation]


def op_enum(table: str):
    """The enum class of a family table's ``op`` field (``UnaryOp`` for ``Unary``), or
    None for a table without one."""
    import importlib

    try:
        module = importlib.import_module(f"{__package__}.generated.etmlx_ir.{table}Op")
    except ModuleNotFoundError:
        return None
    return getattr(module, f"{table}Op")


def schema_operations() -> set:
    """Every operation the IR can express: each node table (``"Sdpa"``), and for a
    family table each member of its op enum (``"Unary.Neg"``). A runtime must
    implement all of them."""
    names = set()
    for table in OP_NAMES.values():
        names.add(table)
        enum = op_enum(table)
        if enum is not None:
            names |= {f"{table}.{name}" for name in enum_names(enum).values()}
    return names
