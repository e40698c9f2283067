import mlx.core as mx

from etmlx.serializer.generated.etmlx_ir.ArgReduceOp import ArgReduceOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp

from .env import floating_operand

REDUCE = {
    ReduceOp.Sum: mx.sum,
    ReduceOp.Mean: mx.mean,
    ReduceOp.Max: mx.max,
    ReduceOp.Min: mx.min,
    ReduceOp.Prod: mx.prod,
    ReduceOp.Any: mx.any,
    ReduceOp.All: mx.all,
}

ARG_REDUCE = {ArgReduceOp.ArgMax: mx.argmax, ArgReduceOp.ArgMin: mx.argmin}

def _variance(op, env):
    x = floating_operand(env.t(op.x), "variance")
    wide = x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x  # PyTorch accumulates in float32
    return mx.var(wide, axis=list(op.axes or []), keepdims=op.keepdims, ddof=op.ddof).astype(x.dtype)


HANDLERS = {
    "Variance": _variance,
    "Reduce": lambda op, env: REDUCE[op.op](env.t(op.x), axis=list(op.axes or []), keepdims=op.keepdims),
    "ArgReduce": lambda op, env: ARG_REDUCE[op.op](env.t(op.x), axis=op.axis, keepdims=op.keepdims),
}
