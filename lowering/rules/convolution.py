"""Convolution and pooling. PyTorch is channels-first, MLX channels-last: activations
are transposed around the op, and a constant weight is laid out for MLX at export."""

import torch

from etmlx.serializer.generated.etmlx_ir import (
    Binary, Concatenate, Conv, ExpandDims, Full, IndexPut, Pool, Reshape, Slice, Squeeze, Transpose,
)
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.PoolOp import PoolOp
from etmlx.serializer.ir import int_or_slot

from ..dtypes import check_floating, fill_fields
from ..registry import lowers
from .common import dtype_of, is_static, out_dtype, rank_of, shape_of, users_use_only_output
from .separable import axis_matrices, lower_per_axis


def _to_channels_last(rank: int) -> list:
    return [0] + list(range(2, rank)) + [1]


def _to_channels_first(rank: int) -> list:
    return [0, rank - 1] + list(range(1, rank - 1))


def _weight_layout(rank: int, transposed: bool) -> list:
    """PyTorch keeps (C_out, C_in/g, *kernel), or (C_in, C_out, *kernel) when transposed;
    MLX wants (C_out, *kernel, C_in) for both."""
    return [1] + list(range(2, rank)) + [0] if transposed else _to_channels_last(rank)


def _check_conv(node, args):
    reason = check_floating(dtype_of(args.input), "convolution")
    if reason:
        return reason
    if rank_of(args.input) not in (3, 4, 5):
        return f"convolution of a rank-{rank_of(args.input)} input"
    if isinstance(args.padding, str):
        return f"padding={args.padding!r}"
    spatial = rank_of(args.input) - 2
    for name in GEOMETRY:
        values = list(getattr(args, name))
        if len(values) not in (1, spatial) or not all(isinstance(v, int) for v in values):
            return f"{name}={values} for {spatial} spatial axes"
        if any(v < (1 if name in ("stride", "dilation") else 0) for v in values):
            return f"{name}={values}"
    return None


GEOMETRY = ("stride", "padding", "dilation", "output_padding")


@lowers("aten::convolution", check=_check_conv)
def _lower_conv(ctx, node, args):
    x, weight, bias, transposed = args.input, args.weight, args.bias, args.transposed
    rank = rank_of(x)
    layout = _weight_layout(rank, transposed)
    if ctx.is_constant(weight):
        w = ctx.add_constant(ctx.constant_values[weight].permute(layout).contiguous())
    else:
        w = ctx.emit(Transpose, x=ctx.tensor(weight), perm=layout)
    x_last = ctx.emit(Transpose, x=ctx.tensor(x), perm=_to_channels_last(rank))
    spatial = rank - 2  # one value is PyTorch's for every axis; the runtimes take one per axis
    stride, padding, dilation, output_padding = (_per_axis(getattr(args, name), spatial) for name in GEOMETRY)
    geometry = dict(stride=stride, padding=padding, dilation=dilation, transposed=bool(transposed),
                    outputPadding=output_padding)
    if transposed and args.groups > 1:
        out = _grouped_transposed(ctx, x_last, w, args.groups, shape_of(x)[1], rank, geometry)
    else:
        out = ctx.emit(Conv, x=x_last, weight=w, groups=args.groups, **geometry)
    if bias is not None:  # channels are last here, so the bias broadcasts as it is
        out = ctx.emit(Binary, op=BinaryOp.Add, a=out, b=ctx.tensor(bias))
    ctx.bind(node, ctx.emit(Transpose, x=out, perm=_to_channels_first(rank)))


def _per_axis(values, spatial: int) -> list:
    """An ``int[2]`` argument given as one value means that value on every axis."""
    values = list(values)
    return values * spatial if len(values) == 1 else values


def _grouped_transposed(ctx, x_last, w, groups: int, channels: int, rank: int, geometry: dict):
    """MLX's transposed convolutions take one group: one per group of input channels
    (the last axis of both x and the MLX-layout weight), outputs concatenated."""
    per_group, last = channels // groups, rank - 1
    outputs = []
    for g in range(groups):
        start, stop = int_or_slot(g * per_group), int_or_slot((g + 1) * per_group)
        x_g = ctx.emit(Slice, x=x_last, axis=last, start=start, stop=stop, step=1)
        w_g = ctx.emit(Slice, x=w, axis=last, start=start, stop=stop, step=1)
        outputs.append(ctx.emit(Conv, x=x_g, weight=w_g, groups=1, **geometry))
    return ctx.emit(Concatenate, xs=outputs, axis=last)


def _spatial_axes(node) -> int:
    """1, 2 or 3, from the operator's name (``aten::avg_pool2d``, ...)."""
    return int(node.target.name().split("pool")[1][0])


def _pool(ctx, node, x, op, kernel, stride, padding, ceil_mode, count_include_pad=True, divisor_override=None):
    """Strides default (an empty list) to the kernel size. An unbatched input (C, *spatial),
    which PyTorch also pools, gets a batch axis of 1 around the op."""
    spatial = _spatial_axes(node)
    unbatched = rank_of(x) == spatial + 1
    rank = spatial + 2
    kernel = _per_axis(kernel, spatial)
    stride = _per_axis(stride, spatial) if stride else kernel
    padding = _per_axis(padding, spatial)
    x = ctx.emit(ExpandDims, x=ctx.tensor(x), axes=[0]) if unbatched else ctx.tensor(x)
    x_last = ctx.emit(Transpose, x=x, perm=_to_channels_last(rank))
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
    out = ctx.emit(Transpose, x=out, perm=_to_channels_first(rank))
    return ctx.emit(Squeeze, x=out, axes=[0]) if unbatched else out


def _check_max_pool(node, args):
    if any(d != 1 for d in args.dilation):
        return "dilated max pooling"
    return users_use_only_output(node, 0)


@lowers(
    "aten::max_pool1d_with_indices", "aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices",
    check=_check_max_pool,
)
def _lower_max_pool(ctx, node, args):
    out = _pool(ctx, node, args.self, PoolOp.Max, args.kernel_size, args.stride, args.padding, args.ceil_mode)
    ctx.bind(node, out, index=0)


def _check_avg_pool(node, args):
    return check_floating(dtype_of(args.self), "average pooling")


@lowers("aten::avg_pool1d", "aten::avg_pool2d", "aten::avg_pool3d", check=_check_avg_pool)
def _lower_avg_pool(ctx, node, args):
    out = _pool(
        ctx, node, args.self, PoolOp.Avg, args.kernel_size, args.stride, args.padding, args.ceil_mode,
        args.count_include_pad, args.get("divisor_override"),
    )
    ctx.bind(node, out)


def _check_adaptive(node, args):
    if not is_static(shape_of(args.self)[-len(args.output_size):]):
        return "adaptive pooling of a dynamic spatial size"
    return None


_ADAPTIVE = {2: torch.ops.aten._adaptive_avg_pool2d, 3: torch.ops.aten._adaptive_avg_pool3d}


@lowers("aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d", check=_check_adaptive)
def _lower_adaptive_avg_pool(ctx, node, args):
    """With evenly dividing sizes adaptive pooling is plain average pooling; else (a
    pyramid pooling module's 1, 2, 3, 6 bins over a 16x16 map) an average over windows
    of varying size per axis: a fixed matrix per axis (``separable.py``)."""
    spatial, outputs = list(shape_of(args.self)[-len(args.output_size):]), list(args.output_size)
    if all(s % o == 0 for s, o in zip(spatial, outputs)):
        kernel = [s // o for s, o in zip(spatial, outputs)]
        ctx.bind(node, _pool(ctx, node, args.self, PoolOp.Avg, kernel, kernel, [0], False))
        return
    pool = _ADAPTIVE[len(spatial)]
    matrices = axis_matrices(lambda x, axis, sizes: pool(x, sizes), spatial, outputs)
    lower_per_axis(ctx, node, args.self, matrices)




def _check_col2im(node, args):
    if not is_static(shape_of(args.self)) or len(args.output_size) != 2:
        return "col2im of a dynamic shape"
    return None


@lowers("aten::col2im", check=_check_col2im)
def _lower_col2im(ctx, node, args):
    """``nn.Fold``: (N, C * kh * kw, L) blocks summed into (N, C, H, W). Each block
    element's place in the padded image is known at export, so the sum is one
    accumulating scatter along the flattened padded image, then the padding is cut off.
    (Overlapping sums may round in another order than PyTorch's loop.)"""
    (height, width), (kh, kw) = args.output_size, args.kernel_size
    (dh, dw), (ph, pw), (sh, sw) = args.dilation, args.padding, args.stride
    batch, packed, blocks = shape_of(args.self)
    channels = packed // (kh * kw)
    padded_h, padded_w = height + 2 * ph, width + 2 * pw
    across = (padded_w - dw * (kw - 1) - 1) // sw + 1
    down = (padded_h - dh * (kh - 1) - 1) // sh + 1
    row = torch.arange(kh).reshape(kh, 1, 1, 1) * dh + torch.arange(down).reshape(1, 1, down, 1) * sh
    column = torch.arange(kw).reshape(1, kw, 1, 1) * dw + torch.arange(across).reshape(1, 1, 1, across) * sw
    places = (row * padded_w + column).reshape(-1).to(torch.int32)  # (i, j, block) order, as the input
    values = ctx.emit(Reshape, x=ctx.tensor(args.self), shape=_sizes(batch, channels, kh * kw * blocks))
    image = ctx.emit(Full, shape=_sizes(batch, channels, padded_h * padded_w), **fill_fields(0, out_dtype(node)))
    image = ctx.emit(IndexPut, x=image, indices=[ctx.add_constant(places)], dims=[2], values=values, accumulate=True)
    image = ctx.emit(Reshape, x=image, shape=_sizes(batch, channels, padded_h, padded_w))
    for axis, (size, pad) in ((2, (height, ph)), (3, (width, pw))):
        if pad:
            image = ctx.emit(Slice, x=image, axis=axis, start=int_or_slot(pad), stop=int_or_slot(pad + size), step=1)
    ctx.bind(node, image)


def _sizes(*sizes) -> list:
    return [int_or_slot(size) for size in sizes]
