import mlx.core as mx

from etmlx.serializer.generated.etmlx_ir.ScanOp import ScanOp

SCAN = {ScanOp.CumSum: mx.cumsum}

HANDLERS = {"Scan": lambda op, env: SCAN[op.op](env.t(op.x), axis=op.axis)}
