"""Convolution and pooling. PyTorch is channels-first, MLX channels-last: activations
are transposed around the op, and a constant weight is laid out for MLX at export."""

from etmlx.serializer.generated.etmlx_ir import Binary, Conv, Pool, Transpose
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.PoolOp import PoolOp

from ..registry import lowers
from .common import rank_of, shape_of, users_use_only_output


def _to_channels_last(rank: int) -> list:
    return [0] + list(range(2, rank)) + [1]


def _to_channels_first(rank: int) -> list:
    return [0, rank - 1] + list(range(1, rank - 1))


def _weight_layout(rank: int, transposed: bool) -> list:
    """PyTorch keeps (C_out, C_in/g, *kernel), or (C_in, C_out, *kernel) when transposed;
    MLX wants (C_out, *kernel, C_in) for both."""
    return [1] + list(range(2, rank)) + [0] if transposed else _to_channels_last(rank)


def _check_conv(node):
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = node.args
    if transposed and groups != 1:
        return "grouped transposed convolution (MLX's takes groups=1)"
    if rank_of(x) not in (3, 4, 5):
        return f"convolution of a rank-{rank_of(x)} input"
    if isinstance(padding, str):
        return f"padding={padding!r}"
    return None


@lowers("aten::convolution", check=_check_conv)
def _lower_conv(ctx, node):
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = node.args
    rank = rank_of(x)
    layout = _weight_layout(rank, transposed)
    if ctx.is_constant(weight):
        w = ctx.add_constant(ctx.constant_values[weight].permute(layout).contiguous())
    else:
        w = ctx.emit(Transpose, x=ctx.tensor(weight), perm=layout)
    x_last = ctx.emit(Transpose, x=ctx.tensor(x), perm=_to_channels_last(rank))
    out = ctx.emit(
        Conv, x=x_last, weight=w, stride=list(stride), padding=list(padding), dilation=list(dilation), groups=groups,
        transposed=bool(transposed), outputPadding=list(output_padding),
    )
    if bias is not None:  # channels are last here, so the bias broadcasts as it is
        out = ctx.emit(Binary, op=BinaryOp.Add, a=out, b=ctx.tensor(bias))
    ctx.bind(node, ctx.emit(Transpose, x=out, perm=_to_channels_first(rank)))


def _pool(ctx, node, op, kernel, stride, padding, ceil_mode, count_include_pad=True, divisor_override=None):
    x = node.args[0]
    rank = rank_of(x)
    spatial = rank - 2
    kernel = list(kernel) * (spatial if len(kernel) == 1 else 1)
    stride = list(stride or kernel) * (spatial if len(stride or kernel) == 1 else 1)
    padding = list(padding) * (spatial if len(padding) == 1 else 1)
    x_last = ctx.emit(Transpose, x=ctx.tensor(x), perm=_to_channels_last(rank))
    out = ctx.emit(
        Pool,
        op=op,
        x=x_last,
        kernel=kernel,
        stride=stride,
        padding=padding,
        ceilMode=bool(ceil_mode),
        countIncludePad=bool(count_include_pad),
        divisorOverride=int(divisor_override or 0),
    )
    return ctx.emit(Transpose, x=out, perm=_to_channels_first(rank))


def _check_max_pool(node):
    dilation = node.args[4] if len(node.args) > 4 else [1]
    if any(d != 1 for d in dilation):
        return "dilated max pooling"
    return users_use_only_output(node, 0)


@lowers("aten::max_pool2d_with_indices", "aten::max_pool1d_with_indices", check=_check_max_pool)
def _lower_max_pool(ctx, node):
    args = list(node.args) + [None] * (6 - len(node.args))
    _, kernel, stride, padding, _, ceil_mode = args
    ctx.bind(node, _pool(ctx, node, PoolOp.Max, kernel, stride, padding or [0], ceil_mode), index=0)


@lowers("aten::avg_pool2d", "aten::avg_pool1d")
def _lower_avg_pool(ctx, node):
    args = list(node.args) + [None] * (7 - len(node.args))
    _, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override = args
    include = True if count_include_pad is None else count_include_pad
    ctx.bind(node, _pool(ctx, node, PoolOp.Avg, kernel, stride, padding or [0], ceil_mode, include, divisor_override))


def _check_adaptive(node):
    x, output_size = node.args[:2]
    spatial = shape_of(x)[2:]
    if not all(isinstance(s, int) and s % o == 0 for s, o in zip(spatial, output_size)):
        return "adaptive pooling whose input size is dynamic or not a multiple of the output size"
    return None


@lowers("aten::_adaptive_avg_pool2d", check=_check_adaptive)
def _lower_adaptive_avg_pool(ctx, node):
    """With evenly dividing sizes adaptive pooling is plain average pooling."""
    x, output_size = node.args[:2]
    kernel = [s // o for s, o in zip(shape_of(x)[2:], output_size)]
    ctx.bind(node, _pool(ctx, node, PoolOp.Avg, kernel, kernel, [0], False))


