"""Softmax, layer norm, group norm and batch norm in eval mode (RMS norm written out is a
fusion: ``lowering/fusions/rms_norm.py``)."""

import torch

from etmlx.serializer.generated.etmlx_ir import (
    AsType,
    Binary,
    LayerNorm,
    LogSoftmax,
    Reduce,
    Reshape,
    Softmax,
    Unary,
    Variance,
)
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp
from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp
from etmlx.serializer.ir import int_or_slot

from ..dtypes import ir_dtype
from ..registry import is_frozen_placeholder, lowers
from .common import as_dtype, dim_size, normalize_axis, out_dtype, rank_of, users_use_only_output


def _check_softmax(node, args):
    return "half_to_float softmax" if args.half_to_float else None


@lowers("aten::_softmax", check=_check_softmax)
def _lower_softmax(ctx, node, args):
    ctx.bind(node, ctx.emit(Softmax, x=ctx.tensor(args.self), axis=normalize_axis(args.dim, rank_of(args.self))))


@lowers("aten::_log_softmax", check=_check_softmax)
def _lower_log_softmax(ctx, node, args):
    ctx.bind(node, ctx.emit(LogSoftmax, x=ctx.tensor(args.self), axis=normalize_axis(args.dim, rank_of(args.self))))


def _check_layer_norm(node, args):
    if len(args.normalized_shape) != 1:
        return f"layer norm over {len(args.normalized_shape)} trailing dims (MLX normalizes the last one)"
    return users_use_only_output(node)


@lowers("aten::native_layer_norm", check=_check_layer_norm)
def _lower_layer_norm(ctx, node, args):
    weight, bias = args.weight, args.bias
    fields = dict(x=ctx.tensor(args.input), eps=float(args.eps), hasWeight=weight is not None, hasBias=bias is not None)
    if weight is not None:
        fields["weight"] = ctx.tensor(weight)
    if bias is not None:
        fields["bias"] = ctx.tensor(bias)
    ctx.bind(node, ctx.emit(LayerNorm, **fields), index=0)


def _check_batch_norm(node, args):
    if not all(arg is None or is_frozen_placeholder(arg) for arg in (args.weight, args.bias, args.running_mean, args.running_var)):
        return "batch norm with non-constant weight or statistics (etmlx folds constant ones)"
    return users_use_only_output(node)


@lowers("aten::_native_batch_norm_legit_no_training", check=_check_batch_norm)
def _lower_batch_norm(ctx, node, args):
    """Folded at export into ``x * scale + shift`` with per-channel constants."""
    x, weight, bias, mean, var, eps = args.input, args.weight, args.bias, args.running_mean, args.running_var, args.eps
    stats = {k: ctx.constant_values[v].double() for k, v in dict(mean=mean, var=var).items()}
    channels = stats["mean"].numel()
    w = ctx.constant_values[weight].double() if weight is not None else torch.ones(channels, dtype=torch.float64)
    b = ctx.constant_values[bias].double() if bias is not None else torch.zeros(channels, dtype=torch.float64)
    scale = w / torch.sqrt(stats["var"] + eps)
    shift = b - stats["mean"] * scale
    dtype = out_dtype(node, 0)
    broadcast = (channels,) + (1,) * (rank_of(x) - 2)
    scaled = ctx.emit(Binary, op=BinaryOp.Mul, a=ctx.tensor(x), b=ctx.add_constant(scale.reshape(broadcast).to(dtype)))
    out = ctx.emit(Binary, op=BinaryOp.Add, a=scaled, b=ctx.add_constant(shift.reshape(broadcast).to(dtype)))
    ctx.bind(node, out, index=0)


def _check_group_norm(node, args):
    if rank_of(args.input) < 2:
        return "group norm of a rank-1 input"
    return users_use_only_output(node)


def _per_channel(ctx, arg, rank: int, dtype):
    """A (C,) weight or bias shaped (C, 1, ..., 1) to broadcast over (N, C, *spatial)."""
    shape = (-1,) + (1,) * (rank - 2)
    if ctx.is_constant(arg):
        return ctx.add_constant(ctx.constant_values[arg].reshape(shape).to(dtype))
    return ctx.emit(Reshape, x=ctx.tensor(arg), shape=[int_or_slot(s) for s in shape])


@lowers("aten::native_group_norm", check=_check_group_norm)
def _lower_group_norm(ctx, node, args):
    """(x - mean) * rsqrt(var + eps) over each group of channels, in float32 for half
    inputs as PyTorch accumulates, then the per-channel affine."""
    x, batch, groups = args.input, args.N, args.group
    dtype, rank = out_dtype(node, 0), rank_of(x)
    wide = _accumulated(dtype)
    grouped = ctx.emit(Reshape, x=as_dtype(ctx, x, wide), shape=[ctx.size(batch), int_or_slot(groups), int_or_slot(-1)])
    normed = _standardized(ctx, grouped, [2], args.eps, wide)
    out = ctx.emit(Reshape, x=normed, shape=[dim_size(ctx, x, axis) for axis in range(rank)])
    ctx.bind(node, _affine(ctx, out, args, wide, dtype, rank), index=0)


def _check_batch_statistics(node, args):
    if rank_of(args.input) < 2:
        return "batch norm of a rank-1 input"
    return users_use_only_output(node)


@lowers("aten::_native_batch_norm_legit.no_stats", check=_check_batch_statistics)
def _lower_batch_norm_batch_statistics(ctx, node, args):
    """Batch norm by the statistics of the input itself (what InstanceNorm and a BatchNorm
    without running statistics export as): per channel over every other axis, in
    float32 for half inputs as PyTorch accumulates, then the per-channel affine."""
    x, dtype, rank = args.input, out_dtype(node, 0), rank_of(args.input)
    wide = _accumulated(dtype)
    normed = _standardized(ctx, as_dtype(ctx, x, wide), [0] + list(range(2, rank)), args.eps, wide)
    ctx.bind(node, _affine(ctx, normed, args, wide, dtype, rank), index=0)


def _accumulated(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _standardized(ctx, x, axes, eps, dtype):
    """``(x - mean) * rsqrt(var + eps)`` over ``axes`` (biased variance)."""
    mean = ctx.emit(Reduce, op=ReduceOp.Mean, x=x, axes=axes, keepdims=True)
    var = ctx.emit(Variance, x=x, axes=axes, keepdims=True, ddof=0)
    centered = ctx.emit(Binary, op=BinaryOp.Sub, a=x, b=mean)
    inv_std = ctx.emit(Unary, op=UnaryOp.Rsqrt, x=ctx.emit(Binary, op=BinaryOp.Add, a=var, b=as_dtype(ctx, eps, dtype)))
    return ctx.emit(Binary, op=BinaryOp.Mul, a=centered, b=inv_std)


def _affine(ctx, out, args, wide, dtype, rank):
    """``out`` back in ``dtype``, times the per-channel weight, plus the bias (each when given)."""
    if wide != dtype:
        out = ctx.emit(AsType, x=out, dtype=ir_dtype(dtype))
    if args.weight is not None:
        out = ctx.emit(Binary, op=BinaryOp.Mul, a=out, b=_per_channel(ctx, args.weight, rank, dtype))
    if args.bias is not None:
        out = ctx.emit(Binary, op=BinaryOp.Add, a=out, b=_per_channel(ctx, args.bias, rank, dtype))
    return out
