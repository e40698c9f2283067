"""MLX implementations of the IR's node tables, one module per op family.

Each module exports ``HANDLERS``: table name -> ``handler(op, env)`` returning the
value of the node's ``out`` (an mx.array) or ``outInt`` (an int).
"""

from . import attention, convolution, creation, elementwise, matmul, normalization, reduction, shape, sizes

HANDLERS = {}
for _family in (attention, convolution, creation, elementwise, matmul, normalization, reduction, shape, sizes):
    HANDLERS.update(_family.HANDLERS)
