"""Ops along one axis: running sums, and sorted values."""

from etmlx.serializer.generated.etmlx_ir import Scan, Slice, Sort
from etmlx.serializer.generated.etmlx_ir.ScanOp import ScanOp
from etmlx.serializer.ir import int_or_slot

from ..registry import lowers
from .common import as_dtype, normalize_axis, out_dtype, rank_of, reversed_along, shape_of, users_use_only_output


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


@lowers("aten::sort", check=_check_sorted_values)
def _lower_sort(ctx, node, args):
    axis, size = _axis_and_size(args)
    out = ctx.emit(Sort, x=ctx.tensor(args.self), axis=axis)
    if args.descending:  # the ascending sort read backwards: NaN, sorted last, comes first as in PyTorch
        out = reversed_along(ctx, out, axis, size)
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
        out = reversed_along(ctx, ascending, axis, size, args.k)
    else:
        out = ctx.emit(Slice, x=ascending, axis=axis, start=int_or_slot(0), stop=int_or_slot(args.k), step=1)
    ctx.bind(node, out, index=0)
