"""Searches in a sorted sequence: ``bucketize``, the bucket each value falls in.

PyTorch finds each value's place by binary search, which is defined only for ascending
boundaries, moving right past every boundary that is not at or above the value (not
above it, ``right=True``): a NaN value lands past them all. MLX has no search, so the
place is counted instead: every boundary less those at or above the value (above it).
For ascending boundaries the two agree exactly, NaN included, so a call is claimed only
where the boundaries are known to ascend: a range of bounds known at export, checked in
its dtype (Idefics3's vision embeddings bucket patch coordinates by ``arange(1/n, 1, 1/n)``). The
count reads every boundary per value, which suits the short sequences such graphs hold.
"""

import torch

from etmlx.serializer.generated.etmlx_ir import AsType, Binary, ExpandDims, Reduce
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp

from ..dtypes import ir_dtype
from ..registry import lowers, op_name
from .common import as_dtype, dtype_of, out_dtype, rank_of, shape_of


def _ascending(boundaries) -> bool:
    """Whether ``boundaries`` is an ``arange`` of bounds known at export whose values (in
    its dtype: a negative start wraps in an unsigned one) never descend."""
    if op_name(getattr(boundaries, "target", None)) != "aten::arange.start_step":
        return False
    bounds = [*boundaries.args, boundaries.kwargs.get("step", 1)][:3]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bounds):
        return False
    values = torch.arange(*bounds, dtype=out_dtype(boundaries))
    return bool((values[1:] >= values[:-1]).all())


def _check_bucketize(node, args):
    boundaries = args.boundaries
    if rank_of(boundaries) != 1:
        return f"bucketize over boundaries of rank {rank_of(boundaries)} (MLX counts over one sequence)"
    if dtype_of(args.self) != dtype_of(boundaries):
        return f"bucketize of {dtype_of(args.self)} values over {dtype_of(boundaries)} boundaries"
    if not _ascending(boundaries):
        return "bucketize over boundaries not known to ascend (PyTorch's binary search is defined for those only)"
    return None


@lowers("aten::bucketize.Tensor", check=_check_bucketize)
def _lower_bucketize(ctx, node, args):
    """Every boundary less those at or above the value (above it, ``right=True``)."""
    values = ctx.emit(ExpandDims, x=ctx.tensor(args.self), axes=[-1])
    dtype = out_dtype(node)
    op = BinaryOp.Greater if args.right else BinaryOp.GreaterEqual
    beyond = _count(ctx, ctx.emit(Binary, op=op, a=ctx.tensor(args.boundaries), b=values), dtype)
    ctx.bind(node, ctx.emit(Binary, op=BinaryOp.Sub, a=as_dtype(ctx, shape_of(args.boundaries)[0], dtype), b=beyond))


def _count(ctx, marks, dtype: torch.dtype):
    """How many of ``marks`` (booleans) hold along the last axis, in ``dtype``."""
    return ctx.emit(Reduce, op=ReduceOp.Sum, x=ctx.emit(AsType, x=marks, dtype=ir_dtype(dtype)), axes=[-1],
                    keepdims=False)
