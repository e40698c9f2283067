"""Ops along one axis: inclusive running reductions (Scan), Sort and ArgSort."""

import mlx.core as mx

from ..generated.mlx_functions import SCAN_OP

HANDLERS = {
    "Scan": lambda op, env: SCAN_OP[op.op](env.t(op.x), axis=op.axis),
    "Sort": lambda op, env: mx.sort(env.t(op.x), axis=op.axis),
    "ArgSort": lambda op, env: mx.argsort(env.t(op.x), axis=op.axis),
}
