"""Elementwise arithmetic, comparison, logic and activations.

Operands are converted to the dtype PyTorch computes in (``torch.result_type`` of
the example values) before the MLX op runs, because MLX promotes differently
(e.g. float16 tensor + float32 0-d tensor is float32 in MLX, float16 in PyTorch).
"""

import torch
from torch import fx

from etmlx.serializer.generated.etmlx_ir import Binary, Unary, Where
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp

from ..registry import lowers
from .common import as_dtype, dtype_of, out_dtype


def _example(arg):
    return arg.meta["val"] if isinstance(arg, fx.Node) else arg


def _compute_dtype(node: fx.Node, a, b) -> torch.dtype:
    result = out_dtype(node)
    if result == torch.bool:  # comparisons and logic: compare in the promoted type
        return torch.result_type(_example(a), _example(b))
    return result


def _binary(ctx, node, op, a, b):
    dtype = _compute_dtype(node, a, b)
    out = ctx.emit(Binary, op=op, a=as_dtype(ctx, a, dtype), b=as_dtype(ctx, b, dtype))
    return out


ARITHMETIC = {
    "aten::mul.Tensor": BinaryOp.Mul,
    "aten::mul.Scalar": BinaryOp.Mul,
    "aten::div.Tensor": BinaryOp.Div,
    "aten::div.Scalar": BinaryOp.Div,
    "aten::maximum": BinaryOp.Maximum,
    "aten::minimum": BinaryOp.Minimum,
    "aten::pow.Tensor_Tensor": BinaryOp.Power,
    "aten::pow.Tensor_Scalar": BinaryOp.Power,
    "aten::eq.Tensor": BinaryOp.Equal,
    "aten::eq.Scalar": BinaryOp.Equal,
    "aten::ne.Tensor": BinaryOp.NotEqual,
    "aten::ne.Scalar": BinaryOp.NotEqual,
    "aten::lt.Tensor": BinaryOp.Less,
    "aten::lt.Scalar": BinaryOp.Less,
    "aten::le.Tensor": BinaryOp.LessEqual,
    "aten::le.Scalar": BinaryOp.LessEqual,
    "aten::gt.Tensor": BinaryOp.Greater,
    "aten::gt.Scalar": BinaryOp.Greater,
    "aten::ge.Tensor": BinaryOp.GreaterEqual,
    "aten::ge.Scalar": BinaryOp.GreaterEqual,
    "aten::logical_and": BinaryOp.LogicalAnd,
    "aten::logical_or": BinaryOp.LogicalOr,
    "aten::remainder.Tensor": BinaryOp.Remainder,
    "aten::remainder.Scalar": BinaryOp.Remainder,
    "aten::floor_divide": BinaryOp.FloorDivide,
    "aten::bitwise_and.Tensor": BinaryOp.BitwiseAnd,
    "aten::bitwise_or.Tensor": BinaryOp.BitwiseOr,
    "aten::bitwise_xor.Tensor": BinaryOp.BitwiseXor,
    "aten::bitwise_and.Scalar": BinaryOp.BitwiseAnd,
    "aten::bitwise_or.Scalar": BinaryOp.BitwiseOr,
    "aten::bitwise_xor.Scalar": BinaryOp.BitwiseXor,
    "aten::atan2": BinaryOp.Atan2,
    "aten::pow.Scalar": BinaryOp.Power,  # a Python number to a tensor power
}


@lowers(*ARITHMETIC)
def _lower_binary(ctx, node, args):
    """A float squared (``x ** 2``: ConvNeXtV2's response norm) is ``x * x``, which is
    what PyTorch computes and, on MLX's CPU, 100x faster than its power kernel."""
    other = args.get("other", args.get("exponent"))  # pow names it ``exponent``
    op = ARITHMETIC[node.target.name()]
    if node.target.name() == "aten::pow.Tensor_Scalar" and other == 2 and out_dtype(node).is_floating_point:
        op, other = BinaryOp.Mul, args.self
    ctx.bind(node, _binary(ctx, node, op, args.self, other))


def _check_add(node, args):
    if args.alpha != 1 and out_dtype(node) == torch.bool:
        return "alpha on a boolean add"
    return None


def _plus_scaled(ctx, node, op, first, second, alpha):
    """``first op alpha * second`` in the dtype PyTorch computes in."""
    dtype = _compute_dtype(node, first, second)
    scaled = as_dtype(ctx, second, dtype)
    if alpha != 1:
        scaled = ctx.emit(Binary, op=BinaryOp.Mul, a=scaled, b=as_dtype(ctx, alpha, dtype))
    return ctx.emit(Binary, op=op, a=as_dtype(ctx, first, dtype), b=scaled)


@lowers("aten::add.Tensor", "aten::add.Scalar", "aten::sub.Tensor", "aten::sub.Scalar", check=_check_add)
def _lower_add_sub(ctx, node, args):
    op = BinaryOp.Add if node.target.name().startswith("aten::add") else BinaryOp.Sub
    ctx.bind(node, _plus_scaled(ctx, node, op, args.self, args.other, args.alpha))


@lowers("aten::rsub.Scalar", check=_check_add)
def _lower_rsub(ctx, node, args):
    """rsub(self, other, alpha) = other - alpha * self."""
    ctx.bind(node, _plus_scaled(ctx, node, BinaryOp.Sub, args.other, args.self, args.alpha))


def _check_div_mode(node, args):
    if args.rounding_mode not in (None, "floor", "trunc"):
        return f"div rounding_mode={args.rounding_mode!r}"
    return None


def _truncated(ctx, x, dtype):
    """Rounded toward zero: ceil below zero, floor elsewhere (NaN and -0.0 kept)."""
    negative = ctx.emit(Binary, op=BinaryOp.Less, a=x, b=as_dtype(ctx, 0, dtype))
    return ctx.emit(
        Where, cond=negative, a=ctx.emit(Unary, op=UnaryOp.Ceil, x=x), b=ctx.emit(Unary, op=UnaryOp.Floor, x=x)
    )


def _truncated_division(ctx, node, a, b):
    """PyTorch's ``trunc`` division: ``trunc(a / b)`` for floats; for integers C's
    quotient, the floor quotient moved up by one where it was inexact and the signs differ."""
    dtype = out_dtype(node)
    a, b = as_dtype(ctx, a, dtype), as_dtype(ctx, b, dtype)
    if dtype.is_floating_point:
        return _truncated(ctx, ctx.emit(Binary, op=BinaryOp.Div, a=a, b=b), dtype)
    floor = ctx.emit(Binary, op=BinaryOp.FloorDivide, a=a, b=b)
    zero = as_dtype(ctx, 0, dtype)
    inexact = ctx.emit(Binary, op=BinaryOp.NotEqual, a=ctx.emit(Binary, op=BinaryOp.Remainder, a=a, b=b), b=zero)
    signs_differ = ctx.emit(
        Binary, op=BinaryOp.NotEqual,
        a=ctx.emit(Binary, op=BinaryOp.Less, a=a, b=zero), b=ctx.emit(Binary, op=BinaryOp.Less, a=b, b=zero),
    )
    moved = ctx.emit(Binary, op=BinaryOp.LogicalAnd, a=inexact, b=signs_differ)
    up = ctx.emit(Binary, op=BinaryOp.Add, a=floor, b=as_dtype(ctx, 1, dtype))
    return ctx.emit(Where, cond=moved, a=up, b=floor)


@lowers("aten::div.Tensor_mode", "aten::div.Scalar_mode", check=_check_div_mode)
def _lower_div_mode(ctx, node, args):
    if args.rounding_mode == "trunc":
        ctx.bind(node, _truncated_division(ctx, node, args.self, args.other))
        return
    op = BinaryOp.FloorDivide if args.rounding_mode == "floor" else BinaryOp.Div
    ctx.bind(node, _binary(ctx, node, op, args.self, args.other))


def _check_fmod(node, args):
    if not out_dtype(node).is_floating_point:
        return "integer fmod (PyTorch raises on a zero divisor, which MLX cannot report)"
    return None


@lowers("aten::fmod.Tensor", "aten::fmod.Scalar", check=_check_fmod)
def _lower_fmod(ctx, node, args):
    """C's fmod, exactly: MLX's remainder of the magnitudes is fmod of the magnitudes
    (its floor adjustment never applies to operands of one sign), then the dividend's
    sign, -0.0 included. (``a - trunc(a / b) * b`` is not exact once a / b rounds.)"""
    dtype = out_dtype(node)
    a, b = as_dtype(ctx, args.self, dtype), as_dtype(ctx, args.other, dtype)
    size = ctx.emit(
        Binary, op=BinaryOp.Remainder, a=ctx.emit(Unary, op=UnaryOp.Abs, x=a), b=ctx.emit(Unary, op=UnaryOp.Abs, x=b)
    )
    zero = as_dtype(ctx, 0, dtype)
    below_zero = ctx.emit(Binary, op=BinaryOp.Less, a=a, b=zero)
    minus_zero = ctx.emit(Binary, op=BinaryOp.Less, a=ctx.emit(Unary, op=UnaryOp.Reciprocal, x=a), b=zero)
    negative = ctx.emit(Binary, op=BinaryOp.LogicalOr, a=below_zero, b=minus_zero)
    ctx.bind(node, ctx.emit(Where, cond=negative, a=ctx.emit(Unary, op=UnaryOp.Neg, x=size), b=size))


@lowers("aten::trunc")
def _lower_trunc(ctx, node, args):
    """Integers are whole already."""
    dtype = out_dtype(node)
    x = ctx.tensor(args.self)
    ctx.bind(node, _truncated(ctx, x, dtype) if dtype.is_floating_point else x)


UNARY = {
    "aten::neg": UnaryOp.Neg,
    "aten::abs": UnaryOp.Abs,
    "aten::exp": UnaryOp.Exp,
    "aten::log": UnaryOp.Log,
    "aten::sqrt": UnaryOp.Sqrt,
    "aten::rsqrt": UnaryOp.Rsqrt,
    "aten::reciprocal": UnaryOp.Reciprocal,
    "aten::sin": UnaryOp.Sin,
    "aten::cos": UnaryOp.Cos,
    "aten::tanh": UnaryOp.Tanh,
    "aten::sigmoid": UnaryOp.Sigmoid,
    "aten::erf": UnaryOp.Erf,
    "aten::floor": UnaryOp.Floor,
    "aten::ceil": UnaryOp.Ceil,
    "aten::silu": UnaryOp.Silu,
    "aten::logical_not": UnaryOp.LogicalNot,
    "aten::sign": UnaryOp.Sign,
    "aten::log1p": UnaryOp.Log1p,
    "aten::expm1": UnaryOp.Expm1,
    "aten::tan": UnaryOp.Tan,
    "aten::atan": UnaryOp.Atan,
    "aten::asin": UnaryOp.Asin,
    "aten::acos": UnaryOp.Acos,
    "aten::sinh": UnaryOp.Sinh,
    "aten::cosh": UnaryOp.Cosh,
    "aten::log2": UnaryOp.Log2,
    "aten::log10": UnaryOp.Log10,
    "aten::round": UnaryOp.Round,  # half to even in both
    "aten::asinh": UnaryOp.Asinh,
    "aten::acosh": UnaryOp.Acosh,
    "aten::atanh": UnaryOp.Atanh,
}


@lowers(*UNARY)
def _lower_unary(ctx, node, args):
    x = as_dtype(ctx, args.self, out_dtype(node))
    ctx.bind(node, ctx.emit(Unary, op=UNARY[node.target.name()], x=x))


@lowers("aten::relu")
def _lower_relu(ctx, node, args):
    """The maximum with a 0-d zero, not MLX's ``nn.relu``: that one's literal zero, written
    into a compiled CPU kernel with a per-channel operand, ran 10-20x slower when the kernel
    overwrote its input in place (MLX 0.32: a ResNet-50 block's batch norm and ReLU after a
    convolution); a 0-d constant is an argument of the compiled graph. The same values as
    ``nn.relu``: NaN stays NaN, -0.0 becomes 0.0 (PyTorch keeps the sign; equal numbers)."""
    dtype = out_dtype(node)
    zero = as_dtype(ctx, 0.0 if dtype.is_floating_point else 0, dtype)
    ctx.bind(node, ctx.emit(Binary, op=BinaryOp.Maximum, a=as_dtype(ctx, args.self, dtype), b=zero))


PREDICATES = {"aten::isnan": UnaryOp.IsNan, "aten::isinf": UnaryOp.IsInf}


@lowers(*PREDICATES)
def _lower_predicate(ctx, node, args):
    """A boolean per element of the operand as it is (an integer is never NaN)."""
    ctx.bind(node, ctx.emit(Unary, op=PREDICATES[node.target.name()], x=ctx.tensor(args.self)))


@lowers("aten::logical_xor")
def _lower_logical_xor(ctx, node, args):
    """Whether exactly one operand is nonzero: their truth values differ."""
    a, b = (as_dtype(ctx, operand, torch.bool) for operand in (args.self, args.other))
    ctx.bind(node, ctx.emit(Binary, op=BinaryOp.NotEqual, a=a, b=b))


@lowers("aten::bitwise_not")
def _lower_bitwise_not(ctx, node, args):
    """PyTorch's bitwise_not of a bool is logical not; MLX inverts integers only."""
    op = UnaryOp.LogicalNot if dtype_of(args.self) == torch.bool else UnaryOp.BitwiseNot
    ctx.bind(node, ctx.emit(Unary, op=op, x=ctx.tensor(args.self)))


def _check_gelu(node, args):
    return None if args.approximate in ("none", "tanh") else f"gelu approximate={args.approximate!r}"


@lowers("aten::gelu", check=_check_gelu)
def _lower_gelu(ctx, node, args):
    op = UnaryOp.GeluTanh if args.approximate == "tanh" else UnaryOp.GeluErf
    ctx.bind(node, ctx.emit(Unary, op=op, x=ctx.tensor(args.self)))


def _clip(ctx, node, x, low, high):
    dtype = out_dtype(node)
    x = as_dtype(ctx, x, dtype)
    if low is not None:
        x = ctx.emit(Binary, op=BinaryOp.Maximum, a=x, b=as_dtype(ctx, low, dtype))
    if high is not None:
        x = ctx.emit(Binary, op=BinaryOp.Minimum, a=x, b=as_dtype(ctx, high, dtype))
    return x


@lowers("aten::clamp", "aten::clamp.Tensor")
def _lower_clamp(ctx, node, args):
    ctx.bind(node, _clip(ctx, node, args.self, args.min, args.max))


@lowers("aten::hardtanh")
def _lower_hardtanh(ctx, node, args):
    ctx.bind(node, _clip(ctx, node, args.self, args.min_val, args.max_val))


@lowers("aten::where.self")
def _lower_where(ctx, node, args):
    dtype = out_dtype(node)
    a, b = as_dtype(ctx, args.self, dtype), as_dtype(ctx, args.other, dtype)
    out = ctx.emit(Where, cond=ctx.tensor(args.condition), a=a, b=b)
    ctx.bind(node, out)


def _scaled(ctx, slot, factor, dtype):
    if factor == 1:
        return slot
    return ctx.emit(Binary, op=BinaryOp.Mul, a=slot, b=as_dtype(ctx, factor, dtype))


@lowers("aten::leaky_relu")
def _lower_leaky_relu(ctx, node, args):
    """where(x > 0, x, x * negative_slope)"""
    dtype = out_dtype(node)
    x = ctx.tensor(args.self)
    positive = ctx.emit(Binary, op=BinaryOp.Greater, a=x, b=as_dtype(ctx, 0, dtype))
    ctx.bind(node, ctx.emit(Where, cond=positive, a=x, b=_scaled(ctx, x, args.negative_slope, dtype)))


@lowers("aten::elu")
def _lower_elu(ctx, node, args):
    """where(x > 0, scale * x, scale * alpha * expm1(input_scale * x)), as PyTorch computes it."""
    alpha, scale, input_scale = args.alpha, args.scale, args.input_scale
    dtype = out_dtype(node)
    x = ctx.tensor(args.self)
    negative = ctx.emit(Unary, op=UnaryOp.Expm1, x=_scaled(ctx, x, input_scale, dtype))
    positive = ctx.emit(Binary, op=BinaryOp.Greater, a=x, b=as_dtype(ctx, 0, dtype))
    ctx.bind(node, ctx.emit(Where, cond=positive, a=_scaled(ctx, x, scale, dtype),
                            b=_scaled(ctx, negative, alpha * scale, dtype)))
