"""Integer arithmetic on sizes (SymInts), which dynamic shapes bring into the graph."""

import torch

from etmlx.serializer.generated.etmlx_ir import IntBinary, SymSize
from etmlx.serializer.generated.etmlx_ir.IntBinaryOp import IntBinaryOp

from ..registry import lowers
from .common import normalize_axis, rank_of


@lowers("aten::sym_size.int")
def _lower_sym_size(ctx, node, args):
    x, dim = args.self, args.dim
    ctx.bind_int(node, ctx.emit(SymSize, x=ctx.tensor(x), axis=normalize_axis(dim, rank_of(x)), outInt=ctx.new_int()))


INT_OPS = {
    "_operator.add": IntBinaryOp.Add,
    "_operator.sub": IntBinaryOp.Sub,
    "_operator.mul": IntBinaryOp.Mul,
    "_operator.floordiv": IntBinaryOp.FloorDivide,
    "_operator.mod": IntBinaryOp.Mod,
}


def _check_int_op(node, args):
    if not isinstance(node.meta.get("val"), torch.SymInt):
        return "arithmetic on a non-integer size"
    return None


@lowers(*INT_OPS, check=_check_int_op)
def _lower_int_op(ctx, node, args):
    op = INT_OPS[f"_operator.{node.target.__name__}"]
    ctx.bind_int(node, ctx.emit(IntBinary, op=op, a=ctx.size(args.a), b=ctx.size(args.b), outInt=ctx.new_int()))


@lowers("_operator.neg", check=_check_int_op)
def _lower_int_neg(ctx, node, args):
    """``-n`` (a slice of the last n columns, ``x[..., -n:]``) as 0 - n."""
    ctx.bind_int(node, ctx.emit(IntBinary, op=IntBinaryOp.Sub, a=ctx.size(0), b=ctx.size(args.a), outInt=ctx.new_int()))
