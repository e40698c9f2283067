"""Ops along one axis: running sums, and sorted values."""

import torch

from etmlx.serializer.generated.etmlx_ir import Scan, Slice, Sort, Take
from etmlx.serializer.generated.etmlx_ir.ScanOp import ScanOp
from etmlx.serializer.ir import int_or_slot

from ..registry import lowers
from .common import as_dtype, normalize_axis, out_dtype, rank_of, shape_of, users_use_only_output


@lowers("aten::cumsum")
def _lower_cumsum(ctx, node, args):
    """(cumprod, cummax and cummin are not core ATen: they never reach lowering.)"""
    x, dim = args.self, args.dim
    # PyTorch accumulates integers and booleans in int64 (or the requested dtype).
    operand = as_dtype(ctx, x, out_dtype(node))
    ctx.bind(node, ctx.emit(Scan, op=ScanOp.CumSum, x=operand, axis=normalize_axis(dim, rank_of(x))))


def _axis_and_size(args):
    axis = normalize_axis(args.dim, rank_of(args.self))
    return axis, shape_of(args.self)[axis]


def _check_sorted_values(node, args):
    """Only the values are computed: PyTorch's sort and topk order the indices of tied
    values their own way (MLX's sort is stable), while ties cannot change the values."""
    if rank_of(args.self) == 0:
        return "sorting a 0-d tensor"
    if not isinstance(_axis_and_size(args)[1], int):
        return "sorting along a dynamic dim"
    reason = users_use_only_output(node, 0)
    return f"{reason} (PyTorch orders the indices of tied values its own way)" if reason else None


def _reversed_positions(ctx, size: int, count: int):
    """The last ``count`` of ``size`` positions, last first: descending order read off
    an ascending sort (NaN, which sorts last, then comes first, as in PyTorch)."""
    return ctx.add_constant(torch.arange(size - 1, size - 1 - count, -1, dtype=torch.int32))


@lowers("aten::sort", check=_check_sorted_values)
def _lower_sort(ctx, node, args):
    axis, size = _axis_and_size(args)
    out = ctx.emit(Sort, x=ctx.tensor(args.self), axis=axis)
    if args.descending:
        out = ctx.emit(Take, x=out, indices=_reversed_positions(ctx, size, size), axis=axis)
    ctx.bind(node, out, index=0)


def _check_topk(node, args):
    if not args.sorted:
        return "topk with sorted=False (PyTorch returns the values in an order of its own)"
    if not isinstance(args.k, int):
        return "topk of a dynamic count"
    return _check_sorted_values(node, args)


@lowers("aten::topk", check=_check_topk)
def _lower_topk(ctx, node, args):
    axis, size = _axis_and_size(args)
    ascending = ctx.emit(Sort, x=ctx.tensor(args.self), axis=axis)
    if args.largest:
        out = ctx.emit(Take, x=ascending, indices=_reversed_positions(ctx, size, args.k), axis=axis)
    else:
        out = ctx.emit(Slice, x=ascending, axis=axis, start=int_or_slot(0), stop=int_or_slot(args.k), step=1)
    ctx.bind(node, out, index=0)
