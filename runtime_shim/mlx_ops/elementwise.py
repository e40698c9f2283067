import mlx.core as mx
import mlx.nn as nn

from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp

from .env import MX_DTYPES, fill_value

UNARY = {
    UnaryOp.Neg: mx.negative,
    UnaryOp.Abs: mx.abs,
    UnaryOp.Exp: mx.exp,
    UnaryOp.Log: mx.log,
    UnaryOp.Sqrt: mx.sqrt,
    UnaryOp.Rsqrt: mx.rsqrt,
    UnaryOp.Reciprocal: mx.reciprocal,
    UnaryOp.Sin: mx.sin,
    UnaryOp.Cos: mx.cos,
    UnaryOp.Tanh: mx.tanh,
    UnaryOp.Sigmoid: mx.sigmoid,
    UnaryOp.Erf: mx.erf,
    UnaryOp.Floor: mx.floor,
    UnaryOp.Ceil: mx.ceil,
    UnaryOp.Relu: nn.relu,
    UnaryOp.Silu: nn.silu,
    UnaryOp.GeluErf: nn.gelu,
    UnaryOp.GeluTanh: nn.gelu_approx,
    UnaryOp.LogicalNot: mx.logical_not,
    UnaryOp.Sign: mx.sign,
    UnaryOp.Log1p: mx.log1p,
    UnaryOp.Expm1: mx.expm1,
    UnaryOp.Tan: mx.tan,
    UnaryOp.Atan: mx.arctan,
    UnaryOp.Asin: mx.arcsin,
    UnaryOp.Acos: mx.arccos,
    UnaryOp.Sinh: mx.sinh,
    UnaryOp.Cosh: mx.cosh,
}

BINARY = {
    BinaryOp.Add: mx.add,
    BinaryOp.Sub: mx.subtract,
    BinaryOp.Mul: mx.multiply,
    BinaryOp.Div: mx.divide,
    BinaryOp.Maximum: mx.maximum,
    BinaryOp.Minimum: mx.minimum,
    BinaryOp.Power: mx.power,
    BinaryOp.Equal: mx.equal,
    BinaryOp.NotEqual: mx.not_equal,
    BinaryOp.Less: mx.less,
    BinaryOp.LessEqual: mx.less_equal,
    BinaryOp.Greater: mx.greater,
    BinaryOp.GreaterEqual: mx.greater_equal,
    BinaryOp.LogicalAnd: mx.logical_and,
    BinaryOp.LogicalOr: mx.logical_or,
    BinaryOp.FloorDivide: mx.floor_divide,
    BinaryOp.Remainder: mx.remainder,
    BinaryOp.BitwiseAnd: mx.bitwise_and,
    BinaryOp.BitwiseOr: mx.bitwise_or,
    BinaryOp.BitwiseXor: mx.bitwise_xor,
}

HANDLERS = {
    "Unary": lambda op, env: UNARY[op.op](env.t(op.x)),
    "Binary": lambda op, env: BINARY[op.op](env.t(op.a), env.t(op.b)),
    "Where": lambda op, env: mx.where(env.t(op.cond), env.t(op.a), env.t(op.b)),
    "AsType": lambda op, env: env.t(op.x).astype(MX_DTYPES[op.dtype]),
    "Scalar": lambda op, env: fill_value(op),
}
