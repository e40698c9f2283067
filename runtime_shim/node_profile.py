"""Where a call's time goes, by IR operation: every node of the Python runtime's etmlx
delegates evaluated on its own and timed, summed per operation (a family table's node
under its op, ``Unary.Erf``, as ``mlx_ops.handled_operations`` names them).

Node by node there is no ``mx.compile`` fusion across nodes and each node waits for its
inputs, so the total exceeds a compiled call's time; the shares are what it shows: which
operations a model spends its time in, to compare with a micro-benchmark of MLX's
kernel for each.
"""

import os
import time
from collections import Counter

import mlx.core as mx

from etmlx.serializer.ir import enum_names, op_enum

from . import mlx_ops
from .mlx_ops import cpu_math


def node_seconds(pte, inputs: list, calls: int = 3, method: str = "forward") -> Counter:
    """Seconds per operation of one call of ``method`` on ``inputs``, the mean of
    ``calls`` calls after one that warms up. ``pte``: a path or the file's bytes."""
    from . import load

    totals, counting = Counter(), [False]
    original = dict(mlx_ops.HANDLERS)

    def timed(table, handler):
        enum = op_enum(table)
        members = enum_names(enum) if enum else None

        def run(op, env):
            start = time.perf_counter()
            value = handler(op, env)
            if isinstance(value, mx.array):
                mx.eval(value)
            if counting[0]:  # not the constant nodes a load evaluates once
                totals[f"{table}.{members[op.op]}" if members else table] += time.perf_counter() - start
            return value

        return run

    previous = os.environ.get("ETMLX_COMPILE")
    os.environ["ETMLX_COMPILE"] = "0"
    # CheckIndex keeps its handler: the delegate tells checks apart by it.
    mlx_ops.HANDLERS.update({t: timed(t, h) for t, h in original.items() if t != "CheckIndex"})
    # cpu_math's forms are many operations that a compiled call fuses into one: compiled
    # alone here, so each is timed as it runs in the program.
    forms = dict(cpu_math.UNARY_OP)
    cpu_math.UNARY_OP.update({op: mx.compile(form) for op, form in forms.items()})
    try:
        program = load(pte)
        program.run_method(method, inputs)
        counting[0] = True
        for _ in range(calls):
            program.run_method(method, inputs)
    finally:
        mlx_ops.HANDLERS.update(original)
        cpu_math.UNARY_OP.update(forms)
        if previous is None:
            del os.environ["ETMLX_COMPILE"]
        else:
            os.environ["ETMLX_COMPILE"] = previous
    return Counter({name: seconds / calls for name, seconds in totals.items()})
