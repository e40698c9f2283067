"""MLX implementations of the IR's node tables, one module per op family.

Each module exports ``HANDLERS``: table name -> ``handler(op, env)`` returning the
value of the node's ``out`` (an mx.array) or ``outInt`` (an int). A family table
(``Unary``, ``Binary``, ...) dispatches on its ``op`` enum through a dict, listed in
``FAMILY_TABLES``: generated from the schema's ``mlx`` attributes where the op is one MLX
function (``runtime_shim/generated/mlx_functions.py``), else the family's own.
"""

from etmlx.serializer.ir import enum_names, op_enum

from ..generated.mlx_functions import ARG_REDUCE_OP, BINARY_OP, REDUCE_OP, SCAN_OP, UNARY_OP

from . import (
    attention, collectives, convolution, creation, elementwise, indexing, matmul, normalization, quantized, reduction, scan,
    shape, sizes, state_space,
)

HANDLERS = {}
_FAMILIES = (
    attention, collectives, convolution, creation, elementwise, indexing, matmul, normalization, quantized, reduction, scan, shape, sizes,
    state_space,
)
for _family in _FAMILIES:
    HANDLERS.update(_family.HANDLERS)

FAMILY_TABLES = {
    "Unary": UNARY_OP,
    "Binary": BINARY_OP,
    "Reduce": REDUCE_OP,
    "ArgReduce": ARG_REDUCE_OP,
    "Scan": SCAN_OP,
    "IntBinary": sizes.INT_BINARY,
    "Pool": convolution.POOL,
}


def handled_operations() -> set:
    """The IR operations this runtime implements, named as ``serializer.ir.schema_operations``
    names them (``"Sdpa"``, ``"Unary.Neg"``), for comparing with the schema and the
    native runtime."""
    names = set(HANDLERS)
    for table, operations in FAMILY_TABLES.items():
        members = enum_names(op_enum(table))
        names |= {f"{table}.{members[op]}" for op in operations}
    return names
