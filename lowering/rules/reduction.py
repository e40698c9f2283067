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
def _lower_reduce(ctx, node):
    x = node.args[0]
    dims = node.args[1] if len(node.args) > 1 else None
    keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
    op = REDUCTIONS[node.target.name()]
    # PyTorch sums integers in int64 and averages in the output dtype: reduce in that dtype.
    operand = ctx.tensor(x) if op in (ReduceOp.Any, ReduceOp.All) else as_dtype(ctx, x, out_dtype(node))
    ctx.bind(node, ctx.emit(Reduce, op=op, x=operand, axes=_axes(x, dims), keepdims=keepdim))


@lowers("aten::sum", "aten::mean")
def _lower_reduce_all(ctx, node):
    x = node.args[0]
    op = ReduceOp.Sum if node.target.name() == "aten::sum" else ReduceOp.Mean
    operand = as_dtype(ctx, x, out_dtype(node))
    ctx.bind(node, ctx.emit(Reduce, op=op, x=operand, axes=_axes(x, None), keepdims=False))


def _check_argreduce(node):
    return None if len(node.args) > 1 and node.args[1] is not None else "arg-reduction over all elements"


@lowers("aten::argmax", "aten::argmin", check=_check_argreduce)
def _lower_argreduce(ctx, node):
    x, dim = node.args[:2]
    keepdim = bool(node.args[2]) if len(node.args) > 2 else False
    op = ArgReduceOp.ArgMax if node.target.name() == "aten::argmax" else ArgReduceOp.ArgMin
    out = ctx.emit(ArgReduce, op=op, x=ctx.tensor(x), axis=normalize_axis(dim, rank_of(x)), keepdims=keepdim)
    ctx.bind(node, ctx.emit(AsType, x=out, dtype=ir_dtype(torch.int64)))  # MLX returns uint32


def _check_max_dim(node):
    return users_use_only_output(node, 0)


@lowers("aten::max.dim", "aten::min.dim", check=_check_max_dim)
def _lower_max_dim(ctx, node):
    x, dim = node.args[:2]
    keepdim = bool(node.args[2]) if len(node.args) > 2 else False
    op = ReduceOp.Max if node.target.name() == "aten::max.dim" else ReduceOp.Min
    out = ctx.emit(Reduce, op=op, x=ctx.tensor(x), axes=[normalize_axis(dim, rank_of(x))], keepdims=keepdim)
    ctx.bind(node, out, index=0)


def _check_var(node):
    correction = node.kwargs.get("correction", 1)
    return None if isinstance(correction, (int, float)) and float(correction).is_integer() else "fractional correction"


@lowers("aten::var.correction", check=_check_var)
def _lower_var(ctx, node):
    x = node.args[0]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    correction = node.kwargs.get("correction")
    keepdim = bool(node.kwargs.get("keepdim", False))
    out = ctx.emit(
        Variance, x=ctx.tensor(x), axes=_axes(x, dims), keepdims=keepdim, ddof=int(1 if correction is None else correction)
    )
    ctx.bind(node, out)
