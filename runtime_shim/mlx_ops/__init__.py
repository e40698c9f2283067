"""MLX implementations of the IR's node tables, one module per op family.

Each module exports ``HANDLERS``: table name -> ``handler(op, env)`` returning the
value of the node's ``out`` (an mx.array) or ``outInt`` (an int).
"""

from . import attention, convolution, creation, elementwise, indexing, matmul, normalization, reduction, scan, shape, sizes

HANDLERS = {}
_FAMILIES = (attention, convolution, creation, elementwise, indexing, matmul, normalization, reduction, scan, shape, sizes)
for _family in _FAMILIES:
    HANDLERS.update(_family.HANDLERS)
