"""Distances between the rows of two point sets, ``_cdist_forward`` (``torch.cdist``), and
between the rows of one, ``_pdist_forward`` (``torch.pdist``: the pairs i < j, in order).

PyTorch computes a p-norm of each pair's difference directly, summing over coordinates
(``agg += |d|^p``, then ``agg^(1/p)``; ``sqrt`` for p=2, a count of nonzeros for p=0, the
largest for p=inf); that is lowered as written. For p=2 on more than 25 points (or when
asked) it uses ``|x|^2 + |y|^2 - 2 x.y`` by a matrix multiply instead: ``torch.cdist``
writes that form out itself before export (its pieces run on MLX), and the operator
reached in that mode is declined, since near-zero distances then come out of a
cancellation whose rounding depends on PyTorch's BLAS. ``pdist`` is always direct.
"""

import math

import torch

from etmlx.serializer.generated.etmlx_ir import AsType, Binary, ExpandDims, Reduce, Reshape, Take, Unary
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp
from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp
from etmlx.serializer.ir import int_or_slot

from ..dtypes import ir_dtype
from ..registry import lowers
from .common import as_dtype, dtype_of, is_static, shape_of

_MATMUL_ABOVE = 25  # PyTorch's use_mm_for_euclid_dist_if_necessary threshold
_USE_MM, _NEVER_MM = 1, 2  # compute_mode values; None and 0 mean "if necessary"


def _check_cdist(node, args):
    x1, x2 = args.x1, args.x2
    if dtype_of(x1) != torch.float32 or dtype_of(x2) != torch.float32:
        return "cdist of tensors that are not float32"
    if not is_static(shape_of(x1)) or not is_static(shape_of(x2)):
        return "cdist of a dynamic shape"
    if args.p < 0:
        return f"cdist with p={args.p}"
    points = max(shape_of(x1)[-2], shape_of(x2)[-2])
    by_matmul = args.compute_mode == _USE_MM or (args.compute_mode != _NEVER_MM and points > _MATMUL_ABOVE)
    if args.p == 2 and by_matmul:
        return (f"cdist with p=2 over {points} points: PyTorch multiplies matrices (more than "
                f"{_MATMUL_ABOVE} points), rounding near-zero distances as its BLAS does")
    return None


@lowers("aten::_cdist_forward", check=_check_cdist)
def _lower_cdist(ctx, node, args):
    """x1 (..., P, M), x2 (..., R, M) -> (..., P, R)."""
    ctx.bind(node, _pairwise(ctx, ctx.tensor(args.x1), ctx.tensor(args.x2), args.p))


def _check_pdist(node, args):
    if dtype_of(args.self) != torch.float32:
        return "pdist of a tensor that is not float32"
    if not is_static(shape_of(args.self)):
        return "pdist of a dynamic shape"
    return None if args.p >= 0 else f"pdist with p={args.p}"


@lowers("aten::_pdist_forward", check=_check_pdist)
def _lower_pdist(ctx, node, args):
    """x (N, M) -> the N (N - 1) / 2 distances of rows i < j, row-major: every pair's
    distance, then those pairs gathered by indices known at export."""
    x = ctx.tensor(args.self)
    count = shape_of(args.self)[0]
    pairs = torch.triu_indices(count, count, offset=1)
    flat = ctx.emit(Reshape, x=_pairwise(ctx, x, x, args.p), shape=[int_or_slot(count * count)])
    index = ctx.add_constant((pairs[0] * count + pairs[1]).to(torch.int32))
    ctx.bind(node, ctx.emit(Take, x=flat, indices=index, axis=0))


def _pairwise(ctx, x1, x2, p: float):
    """The p-norm distances (..., P, R) of rows x1 (..., P, M) and x2 (..., R, M): the
    differences of every pair (..., P, R, M), then their norm over M."""
    rows = ctx.emit(ExpandDims, x=x1, axes=[-2])
    columns = ctx.emit(ExpandDims, x=x2, axes=[-3])
    difference = ctx.emit(Binary, op=BinaryOp.Sub, a=rows, b=columns)

    def total(op, x):
        return ctx.emit(Reduce, op=op, x=x, axes=[-1], keepdims=False)

    if p == 0:
        nonzero = ctx.emit(Binary, op=BinaryOp.NotEqual, a=difference, b=as_dtype(ctx, 0.0, torch.float32))
        return total(ReduceOp.Sum, ctx.emit(AsType, x=nonzero, dtype=ir_dtype(torch.float32)))
    if math.isinf(p):
        return total(ReduceOp.Max, ctx.emit(Unary, op=UnaryOp.Abs, x=difference))
    if p == 1:
        return total(ReduceOp.Sum, ctx.emit(Unary, op=UnaryOp.Abs, x=difference))
    if p == 2:
        squares = ctx.emit(Binary, op=BinaryOp.Mul, a=difference, b=difference)
        return ctx.emit(Unary, op=UnaryOp.Sqrt, x=total(ReduceOp.Sum, squares))
    powers = ctx.emit(Binary, op=BinaryOp.Power, a=ctx.emit(Unary, op=UnaryOp.Abs, x=difference),
                      b=as_dtype(ctx, float(p), torch.float32))
    return ctx.emit(Binary, op=BinaryOp.Power, a=total(ReduceOp.Sum, powers), b=as_dtype(ctx, 1.0 / p, torch.float32))
