# Generated from serializer/schema.fbs by serializer/regenerate.py. Do not edit.
"""The MLX function each op enum value runs (schema.fbs's `mlx` attributes)."""

import mlx.core as mx
import mlx.nn as nn

from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp
from etmlx.serializer.generated.etmlx_ir.ArgReduceOp import ArgReduceOp
from etmlx.serializer.generated.etmlx_ir.ScanOp import ScanOp


UNARY_OP = {
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


BINARY_OP = {
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


REDUCE_OP = {
    ReduceOp.Sum: mx.sum,
    ReduceOp.Mean: mx.mean,
    ReduceOp.Max: mx.max,
    ReduceOp.Min: mx.min,
    ReduceOp.Prod: mx.prod,
    ReduceOp.Any: mx.any,
    ReduceOp.All: mx.all,
}


ARG_REDUCE_OP = {
    ArgReduceOp.ArgMax: mx.argmax,
    ArgReduceOp.ArgMin: mx.argmin,
}


SCAN_OP = {
    ScanOp.CumSum: mx.cumsum,
}
