import mlx.core as mx

from ..generated.mlx_functions import ARG_REDUCE_OP, REDUCE_OP
from .env import floating_operand


def _variance(op, env):
    x = floating_operand(env.t(op.x), "variance")
    wide = x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x  # PyTorch accumulates in float32
    return mx.var(wide, axis=list(op.axes or []), keepdims=op.keepdims, ddof=op.ddof).astype(x.dtype)


HANDLERS = {
    "Variance": _variance,
    "Reduce": lambda op, env: REDUCE_OP[op.op](env.t(op.x), axis=list(op.axes or []), keepdims=op.keepdims),
    "ArgReduce": lambda op, env: ARG_REDUCE_OP[op.op](env.t(op.x), axis=op.axis, keepdims=op.keepdims),
}
