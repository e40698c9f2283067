"""Ops along one axis: inclusive running reductions (Scan), Sort and ArgSort."""

import mlx.core as mx

from etmlx.serializer.generated.etmlx_ir.ScanOp import ScanOp

SCAN = {ScanOp.CumSum: mx.cumsum}

HANDLERS = {
    "Scan": lambda op, env: SCAN[op.op](env.t(op.x), axis=op.axis),
    "Sort": lambda op, env: mx.sort(env.t(op.x), axis=op.axis),
    "ArgSort": lambda op, env: mx.argsort(env.t(op.x), axis=op.axis),
}
