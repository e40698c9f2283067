import mlx.core as mx

from etmlx.serializer.generated.etmlx_ir.IntBinaryOp import IntBinaryOp

from .env import MX_DTYPES

INT_BINARY = {
    IntBinaryOp.Add: lambda a, b: a + b,
    IntBinaryOp.Sub: lambda a, b: a - b,
    IntBinaryOp.Mul: lambda a, b: a * b,
    IntBinaryOp.FloorDivide: lambda a, b: a // b,
    IntBinaryOp.Mod: lambda a, b: a % b,
}

HANDLERS = {
    "SymSize": lambda op, env: env.t(op.x).shape[op.axis],
    "IntBinary": lambda op, env: INT_BINARY[op.op](env.size(op.a), env.size(op.b)),
    "SizeScalar": lambda op, env: mx.array(env.size(op.value), dtype=MX_DTYPES[op.dtype]),
}
