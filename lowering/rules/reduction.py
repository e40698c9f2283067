"""Reductions over axes, and arg-reductions."""

import torch

from etmlx.serializer.generated.etmlx_ir import ArgReduce, AsType, Reduce, Reshape, Variance
from etmlx.serializer.generated.etmlx_ir.ArgReduceOp import ArgReduceOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp
from etmlx.serializer.ir import int_or_slot

from ..dtypes import ir_dtype
from ..registry import lowers
from .common import as_dtype, normalize_axis, out_dtype, rank_of, used_outputs

REDUCTIONS = {
    "aten::sum.dim_IntList": ReduceOp.Sum,
    "aten::mean.dim": ReduceOp.Mean,
    "aten::amax": ReduceOp.Max,
    "aten::amin": ReduceOp.Min,
    "aten::prod.dim_int": ReduceOp.Prod,
    "aten::any.dims": ReduceOp.Any,
    "aten::any.dim": ReduceOp.Any,
    "aten::all.dims": ReduceOp.All,
    "aten::all.dim": ReduceOp.All,
    "aten::any": ReduceOp.Any,
    "aten::all": ReduceOp.All,
}


def _axes(x, dims) -> list:
    rank = rank_of(x)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return sorted({normalize_axis(d, rank) for d in dims})


@lowers(*REDUCTIONS)
def _lower_reduce(ctx, node, args):
    """``any``/``all`` without a dim reduce everything; so does an empty dim list."""
    x, dims, keepdim = args.self, args.get("dim"), bool(args.get("keepdim", False))
    op = REDUCTIONS[node.target.name()]
    if op in (ReduceOp.Any, ReduceOp.All):
        # MLX answers in bool; PyTorch answers a uint8 tensor in uint8 (0 or 1).
        found = ctx.emit(Reduce, op=op, x=ctx.tensor(x), axes=_axes(x, dims), keepdims=keepdim)
        dtype = out_dtype(node)
        ctx.bind(node, found if dtype == torch.bool else ctx.emit(AsType, x=found, dtype=ir_dtype(dtype)))
        return
    # PyTorch sums integers in int64 and averages in the output dtype: reduce in that dtype.
    operand = as_dtype(ctx, x, out_dtype(node))
    ctx.bind(node, ctx.emit(Reduce, op=op, x=operand, axes=_axes(x, dims), keepdims=keepdim))


REDUCE_ALL = {
    "aten::sum": ReduceOp.Sum,
    "aten::mean": ReduceOp.Mean,
    "aten::prod": ReduceOp.Prod,
    "aten::max": ReduceOp.Max,
    "aten::min": ReduceOp.Min,
}


@lowers(*REDUCE_ALL)
def _lower_reduce_all(ctx, node, args):
    x = args.self
    op = REDUCE_ALL[node.target.name()]
    operand = as_dtype(ctx, x, out_dtype(node))
    ctx.bind(node, ctx.emit(Reduce, op=op, x=operand, axes=_axes(x, None), keepdims=False))


def _indices(ctx, op, x_slot, axis: int, keepdims: bool):
    """Where the extremum is (the first one among equals, as in PyTorch), as PyTorch's
    int64 (MLX's arg-reductions return uint32)."""
    found = ctx.emit(ArgReduce, op=op, x=x_slot, axis=axis, keepdims=keepdims)
    return ctx.emit(AsType, x=found, dtype=ir_dtype(torch.int64))


@lowers("aten::argmax", "aten::argmin")
def _lower_argreduce(ctx, node, args):
    """Without ``dim``: the index into the flattened tensor (keepdim: shaped all ones)."""
    x, keepdim = args.self, bool(args.keepdim)
    op = ArgReduceOp.ArgMax if node.target.name() == "aten::argmax" else ArgReduceOp.ArgMin
    if args.dim is not None:
        ctx.bind(node, _indices(ctx, op, ctx.tensor(x), normalize_axis(args.dim, rank_of(x)), keepdim))
        return
    out = _indices(ctx, op, ctx.emit(Reshape, x=ctx.tensor(x), shape=[int_or_slot(-1)]), 0, False)
    ctx.bind(node, ctx.emit(Reshape, x=out, shape=[int_or_slot(1)] * rank_of(x)) if keepdim else out)


@lowers("aten::max.dim", "aten::min.dim")
def _lower_max_dim(ctx, node, args):
    """Values and indices, each computed only when used."""
    x, keepdim = args.self, bool(args.keepdim)
    axis = normalize_axis(args.dim, rank_of(x))
    is_max = node.target.name() == "aten::max.dim"
    used = used_outputs(node)
    if 0 in used:
        out = ctx.emit(Reduce, op=ReduceOp.Max if is_max else ReduceOp.Min, x=ctx.tensor(x), axes=[axis], keepdims=keepdim)
        ctx.bind(node, out, index=0)
    if 1 in used:
        op = ArgReduceOp.ArgMax if is_max else ArgReduceOp.ArgMin
        ctx.bind(node, _indices(ctx, op, ctx.tensor(x), axis, keepdim), index=1)


def _correction(args):
    """``var.correction``: ``None`` means Bessel's correction, 1; ``var.dim``: ``unbiased``."""
    unbiased = args.get("unbiased")
    if unbiased is not None:
        return 1 if unbiased else 0
    return 1 if args.correction is None else args.correction


def _check_var(node, args):
    correction = _correction(args)
    return None if isinstance(correction, (int, float)) and float(correction).is_integer() else "fractional correction"


@lowers("aten::var.correction", "aten::var.dim", check=_check_var)
def _lower_var(ctx, node, args):
    x = args.self
    out = ctx.emit(
        Variance, x=ctx.tensor(x), axes=_axes(x, args.dim), keepdims=bool(args.keepdim), ddof=int(_correction(args))
    )
    ctx.bind(node, out)
