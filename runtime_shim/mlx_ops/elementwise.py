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
    UnaryOp.IsNan: mx.isnan,
    UnaryOp.IsInf: mx.isinf,
    UnaryOp.Log2: mx.log2,
    UnaryOp.Log10: mx.log10,
    UnaryOp.Round: mx.round,
    UnaryOp.Asinh: mx.arcsinh,
    UnaryOp.Acosh: mx.arccosh,
    UnaryOp.Atanh: mx.arctanh,
    UnaryOp.BitwiseNot: mx.bitwise_invert,
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
    BinaryOp.Atan2: mx.arctan2,
}

def _as_type(op, env):
    x, dtype = env.t(op.x), MX_DTYPES[op.dtype]
    if mx.issubdtype(x.dtype, mx.floating) and mx.issubdtype(dtype, mx.integer):
        return _float_to_integer(x, dtype)
    return x.astype(dtype)


def _float_to_integer(x: mx.array, dtype) -> mx.array:
    """``x`` cast to an integer dtype, defined for every value and as PyTorch casts on
    x86: through int32 for int32 and narrower dtypes, else int64, where NaN and values out of range give the
    minimum ("integer indefinite"); narrower dtypes then wrap. A plain cast of those values
    is undefined behaviour in the C++ that mx.compile generates, and indices computed
    this way must stay clampable (indexing.py)."""
    through = mx.int32 if dtype == mx.int32 or dtype.size < 4 else mx.int64
    end = 2.0 ** (31 if through == mx.int32 else 63)  # a power of two: exact in float32
    wide = x.astype(mx.float32)  # exact for float16 and bfloat16
    indefinite = (wide < -end) | (wide >= end) | mx.isnan(wide)
    inside = mx.where(indefinite, 0.0, wide).astype(through)
    cast = mx.where(indefinite, mx.array(-end, dtype=mx.float32).astype(through), inside)
    return cast if dtype == through else cast.astype(dtype)


HANDLERS = {
    "Unary": lambda op, env: UNARY[op.op](env.t(op.x)),
    "Binary": lambda op, env: BINARY[op.op](env.t(op.a), env.t(op.b)),
    "Where": lambda op, env: mx.where(env.t(op.cond), env.t(op.a), env.t(op.b)),
    "AsType": _as_type,
    "Scalar": lambda op, env: fill_value(op),
}
