"""Sampling an image at computed coordinates: ``grid_sampler_2d`` (``F.grid_sample``).

Written as PyTorch's CPU kernel computes it, in its order (``GridSamplerKernel.cpp``):
each output position's source coordinates are unnormalized from [-1, 1], clipped or
reflected into the image (``padding_mode``), then read bilinearly from the four
neighbouring pixels (a corner outside the image reads 0) or from the nearest one (ties
to even, as ``nearbyint``). Reads are gathers from the image flattened per channel.
"""

import torch

from etmlx.serializer.generated.etmlx_ir import (
    AsType, Binary, Reshape, Slice, TakeAlongAxis, Unary, Where,
)
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp
from etmlx.serializer.ir import int_or_slot

from ..dtypes import ir_dtype
from ..registry import lowers
from .common import as_dtype, dtype_of, is_static, shape_of

_BILINEAR, _NEAREST = 0, 1
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _check_grid_sampler(node, args):
    if args.interpolation_mode not in (_BILINEAR, _NEAREST):
        return "bicubic grid sampling"
    if dtype_of(args.input) != torch.float32:
        return "grid sampling in half precision (PyTorch's CPU kernel rounds in its own order)"
    if not is_static(shape_of(args.input)) or not is_static(shape_of(args.grid)):
        return "grid sampling of a dynamic shape"
    return None


@lowers("aten::grid_sampler_2d", check=_check_grid_sampler)
def _lower_grid_sampler(ctx, node, args):
    """input (N, C, H, W), grid (N, Ho, Wo, 2) holding (x, y) -> (N, C, Ho, Wo)."""
    batch, channels, height, width = shape_of(args.input)
    _, rows, columns, _ = shape_of(args.grid)
    positions = rows * columns
    grid = ctx.tensor(args.grid)
    ops = _Ops(ctx)
    x, y = (
        _source(ops, _coordinate(ctx, grid, axis, batch, positions), size, args.padding_mode, args.align_corners)
        for axis, size in ((0, width), (1, height))
    )
    image = ctx.emit(Reshape, x=ctx.tensor(args.input), shape=[int_or_slot(s) for s in (batch, channels, height * width)])
    if args.interpolation_mode == _NEAREST:
        out = _read(ops, image, ops.unary(UnaryOp.Round, x), ops.unary(UnaryOp.Round, y), height, width)
    else:
        west, north = ops.unary(UnaryOp.Floor, x), ops.unary(UnaryOp.Floor, y)
        east, south = ops.add(west, 1.0), ops.add(north, 1.0)
        w, n = ops.sub(x, west), ops.sub(y, north)
        e, s = ops.sub(1.0, w), ops.sub(1.0, n)
        corners = ((west, north, ops.mul(s, e)), (east, north, ops.mul(s, w)),
                   (west, south, ops.mul(n, e)), (east, south, ops.mul(n, w)))
        out = None
        for cx, cy, weight in corners:
            term = ops.mul(_read(ops, image, cx, cy, height, width), weight)
            out = term if out is None else ops.add(out, term)
    shape = [int_or_slot(s) for s in (batch, channels, rows, columns)]
    ctx.bind(node, ctx.emit(Reshape, x=out, shape=shape))


class _Ops:
    """float32 arithmetic on slots, a Python number becoming a 0-d constant."""

    def __init__(self, ctx):
        self.ctx = ctx

    def _operand(self, value):
        return as_dtype(self.ctx, value, torch.float32) if isinstance(value, (int, float)) else value

    def binary(self, op, a, b):
        return self.ctx.emit(Binary, op=op, a=self._operand(a), b=self._operand(b))

    def add(self, a, b):
        return self.binary(BinaryOp.Add, a, b)

    def sub(self, a, b):
        return self.binary(BinaryOp.Sub, a, b)

    def mul(self, a, b):
        return self.binary(BinaryOp.Mul, a, b)

    def unary(self, op, x):
        return self.ctx.emit(Unary, op=op, x=x)

    def clip(self, x, size: int):
        return self.binary(BinaryOp.Minimum, self.binary(BinaryOp.Maximum, x, 0.0), float(size - 1))


def _coordinate(ctx, grid, axis: int, batch: int, positions: int):
    """grid[..., axis] as (N, 1, Ho * Wo)."""
    part = ctx.emit(Slice, x=grid, axis=3, start=int_or_slot(axis), stop=int_or_slot(axis + 1), step=1)
    return ctx.emit(Reshape, x=part, shape=[int_or_slot(batch), int_or_slot(1), int_or_slot(positions)])


def _source(ops, coordinate, size: int, padding_mode: int, align_corners: bool):
    """PyTorch's compute_coordinates(unnormalize(...)) as its vectorized kernel writes it."""
    if align_corners:
        coordinate = ops.mul(ops.add(coordinate, 1.0), (size - 1) / 2)
    else:
        coordinate = ops.sub(ops.mul(ops.add(coordinate, 1.0), size / 2), 0.5)
    if padding_mode == _BORDER:
        return ops.clip(coordinate, size)
    if padding_mode == _REFLECTION:
        low, high = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return ops.clip(_reflect(ops, coordinate, low, high), size)
    return coordinate


def _reflect(ops, coordinate, twice_low: int, twice_high: int):
    """Reflected at low / 2 and high / 2 until inside: PyTorch's reflect_coordinates."""
    if twice_low == twice_high:
        return ops.mul(coordinate, 0.0)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = ops.unary(UnaryOp.Abs, ops.sub(coordinate, low))
    extra = ops.binary(BinaryOp.Remainder, distance, span)  # fmod: both non-negative
    flips = ops.unary(UnaryOp.Floor, ops.binary(BinaryOp.Div, distance, span))
    even = ops.binary(BinaryOp.Equal, ops.binary(BinaryOp.Remainder, flips, 2.0), 0.0)
    return ops.ctx.emit(Where, cond=even, a=ops.add(extra, low), b=ops.add(ops.sub(span, extra), low))


def _read(ops, image, x, y, height: int, width: int):
    """image (N, C, H * W) at pixel (x, y) per position (N, 1, L), 0 outside the image."""
    ctx = ops.ctx
    inside = None
    for value, size in ((x, width), (y, height)):
        for op, bound in ((BinaryOp.GreaterEqual, 0.0), (BinaryOp.LessEqual, float(size - 1))):
            test = ops.binary(op, value, bound)
            inside = test if inside is None else ops.binary(BinaryOp.LogicalAnd, inside, test)
    column, row = (ctx.emit(AsType, x=ops.clip(v, size), dtype=ir_dtype(torch.int32)) for v, size in ((x, width), (y, height)))
    width_slot = as_dtype(ctx, width, torch.int32)
    flat = ctx.emit(Binary, op=BinaryOp.Add, a=ctx.emit(Binary, op=BinaryOp.Mul, a=row, b=width_slot), b=column)
    values = ctx.emit(TakeAlongAxis, x=image, indices=flat, axis=2)
    return ctx.emit(Where, cond=inside, a=values, b=as_dtype(ctx, 0.0, torch.float32))
