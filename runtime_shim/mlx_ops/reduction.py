import mlx.core as mx

from etmlx.serializer.generated.etmlx_ir.ArgReduceOp import ArgReduceOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp

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

HANDLERS = {
    "Reduce": lambda op, env: REDUCE[op.op](env.t(op.x), axis=list(op.axes or []), keepdims=op.keepdims),
    "ArgReduce": lambda op, env: ARG_REDUCE[op.op](env.t(op.x), axis=op.axis, keepdims=op.keepdims),
}
