"""Ops along one axis: running sums, and sorting (``sort``, ``topk``).

Sorted values are the same whatever the order of ties. Indices are not: PyTorch leaves
the order of tied values' indices unspecified, and its CPU kernels do not keep any rule
(``topk(zeros(8), 2)`` gives ``[6, 5]`` on Linux, from libstdc++'s ``std::nth_element``;
other C++ libraries, CUDA and MPS run other algorithms, which need not agree). etmlx gives ties one rule on
every device: the lowest index first, in both directions. So indices equal PyTorch's
wherever the values they sort are distinct, and the values always do.
"""

import torch

from etmlx.serializer.generated.etmlx_ir import ArgSort, AsType, Binary, Scan, Slice, Sort, TakeAlongAxis
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.ScanOp import ScanOp
from etmlx.serializer.ir import int_or_slot

from ..dtypes import ir_dtype
from ..registry import lowers
from .common import as_dtype, normalize_axis, out_dtype, rank_of, reversed_along, shape_of, used_outputs


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


def check_sortable(node, args):
    if rank_of(args.self) == 0:
        return "sorting a 0-d tensor"
    if not isinstance(_axis_and_size(args)[1], int):
        return "sorting along a dynamic dim"
    return None


def _check_sort(node, args):
    """An ascending sort of the whole axis needs no size: it may be dynamic."""
    if not args.descending and rank_of(args.self) > 0:
        return None
    return check_sortable(node, args)


def _order(ctx, args, descending: bool, count):
    """The first ``count`` positions of ``args.self`` sorted along its axis, as int64
    (the first ``count`` outputs of PyTorch's indices; all of them for None), ties
    lowest index first. Descending: the stable ascending order of x read backwards,
    mapped back (n - 1 - i), so that ties keep their order and NaN, sorted last, comes
    first."""
    axis, size = _axis_and_size(args)
    x = ctx.tensor(args.self)
    if not descending:
        order = ctx.emit(ArgSort, x=x, axis=axis)
        if count is not None and count < size:
            order = ctx.emit(Slice, x=order, axis=axis, start=int_or_slot(0), stop=int_or_slot(count), step=1)
        return ctx.emit(AsType, x=order, dtype=ir_dtype(torch.int64))
    backwards = ctx.emit(ArgSort, x=reversed_along(ctx, x, axis, size), axis=axis)
    mirrored = ctx.emit(AsType, x=reversed_along(ctx, backwards, axis, size, count), dtype=ir_dtype(torch.int64))
    last = as_dtype(ctx, size - 1, torch.int64)
    return ctx.emit(Binary, op=BinaryOp.Sub, a=last, b=mirrored)


def _bind_sorted(ctx, node, args, descending: bool, count: int) -> None:
    """Values and indices, each computed only when used; values read through the
    indices when both are, so that the two agree."""
    axis, size = _axis_and_size(args)
    used = used_outputs(node)
    if 1 in used:
        order = _order(ctx, args, descending, count)
        ctx.bind(node, order, index=1)
        if 0 in used:
            ctx.bind(node, ctx.emit(TakeAlongAxis, x=ctx.tensor(args.self), indices=order, axis=axis), index=0)
        return
    ascending = ctx.emit(Sort, x=ctx.tensor(args.self), axis=axis)
    if descending:  # read backwards: NaN, sorted last, comes first as in PyTorch
        ctx.bind(node, reversed_along(ctx, ascending, axis, size, count), index=0)
    elif count is not None and count < size:
        ctx.bind(node, ctx.emit(Slice, x=ascending, axis=axis, start=int_or_slot(0), stop=int_or_slot(count), step=1), index=0)
    else:
        ctx.bind(node, ascending, index=0)


@lowers("aten::sort", check=_check_sort)
def _lower_sort(ctx, node, args):
    descending = bool(args.descending)
    _bind_sorted(ctx, node, args, descending, _axis_and_size(args)[1] if descending else None)


def _check_topk(node, args):
    if not args.sorted:
        return "topk with sorted=False (PyTorch returns the values in an order of its own)"
    if not isinstance(args.k, int):
        return "topk of a dynamic count"
    return check_sortable(node, args)


@lowers("aten::topk", check=_check_topk)
def _lower_topk(ctx, node, args):
    _bind_sorted(ctx, node, args, bool(args.largest), args.k)
