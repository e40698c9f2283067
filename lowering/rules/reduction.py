"""Reductions over axes, and arg-reductions."""

import torch

from etmlx.serializer.generated.etmlx_ir import ArgReduce, AsType, Reduce, Variance
from etmlx.serializer.generated.etmlx_ir.ArgReduceOp import ArgReduceOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp

from ..dtypes import ir_dtype
from ..registry import lowers
from .common import as_dtype, normalize_axis, out_dtype, rank_of, users_use_only_output

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
    # PyTorch sums integers in int64 and averages in the output dtype: reduce in that dtype.
    operand = ctx.tensor(x) if op in (ReduceOp.Any, ReduceOp.All) else as_dtype(ctx, x, out_dtype(node))
    ctx.bind(node, ctx.emit(Reduce, op=op, x=operand, axes=_axes(x, dims), keepdims=keepdim))


@lowers("aten::sum", "aten::mean")
def _lower_reduce_all(ctx, node, args):
    x = args.self
    op = ReduceOp.Sum if node.target.name() == "aten::sum" else ReduceOp.Mean
    operand = as_dtype(ctx, x, out_dtype(node))
    ctx.bind(node, ctx.emit(Reduce, op=op, x=operand, axes=_axes(x, None), keepdims=False))


def _check_argreduce(node, args):
    return None if args.dim is not None else "arg-reduction over all elements"


@lowers("aten::argmax", "aten::argmin", check=_check_argreduce)
def _lower_argreduce(ctx, node, args):
    x, dim, keepdim = args.self, args.dim, bool(args.keepdim)
    op = ArgReduceOp.ArgMax if node.target.name() == "aten::argmax" else ArgReduceOp.ArgMin
    out = ctx.emit(ArgReduce, op=op, x=ctx.tensor(x), axis=normalize_axis(dim, rank_of(x)), keepdims=keepdim)
    ctx.bind(node, ctx.emit(AsType, x=out, dtype=ir_dtype(torch.int64)))  # MLX returns uint32


def _check_max_dim(node, args):
    return users_use_only_output(node, 0)


@lowers("aten::max.dim", "aten::min.dim", check=_check_max_dim)
def _lower_max_dim(ctx, node, args):
    x, dim, keepdim = args.self, args.dim, bool(args.keepdim)
    op = ReduceOp.Max if node.target.name() == "aten::max.dim" else ReduceOp.Min
    out = ctx.emit(Reduce, op=op, x=ctx.tensor(x), axes=[normalize_axis(dim, rank_of(x))], keepdims=keepdim)
    ctx.bind(node, out, index=0)


def _correction(args):
    """``None`` means Bessel's correction, 1."""
    return 1 if args.correction is None else args.correction


def _check_var(node, args):
    correction = _correction(args)
    return None if isinstance(correction, (int, float)) and float(correction).is_integer() else "fractional correction"


@lowers("aten::var.correction", check=_check_var)
def _lower_var(ctx, node, args):
    x = args.self
    out = ctx.emit(
        Variance, x=ctx.tensor(x), axes=_axes(x, args.dim), keepdims=bool(args.keepdim), ddof=int(_correction(args))
    )
    ctx.bind(node, out)
