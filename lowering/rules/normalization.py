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
    x, weight, bias, batch, groups, eps = args.input, args.weight, args.bias, args.N, args.group, args.eps
    dtype, rank = out_dtype(node, 0), rank_of(x)
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    grouped = ctx.emit(Reshape, x=as_dtype(ctx, x, wide), shape=[ctx.size(batch), int_or_slot(groups), int_or_slot(-1)])
    mean = ctx.emit(Reduce, op=ReduceOp.Mean, x=grouped, axes=[2], keepdims=True)
    var = ctx.emit(Variance, x=grouped, axes=[2], keepdims=True, ddof=0)
    centered = ctx.emit(Binary, op=BinaryOp.Sub, a=grouped, b=mean)
    inv_std = ctx.emit(Unary, op=UnaryOp.Rsqrt, x=ctx.emit(Binary, op=BinaryOp.Add, a=var, b=as_dtype(ctx, eps, wide)))
    normed = ctx.emit(Binary, op=BinaryOp.Mul, a=centered, b=inv_std)
    out = ctx.emit(Reshape, x=normed, shape=[dim_size(ctx, x, axis) for axis in range(rank)])
    if wide != dtype:
        out = ctx.emit(AsType, x=out, dtype=ir_dtype(dtype))
    if weight is not None:
        out = ctx.emit(Binary, op=BinaryOp.Mul, a=out, b=_per_channel(ctx, weight, rank, dtype))
    if bias is not None:
        out = ctx.emit(Binary, op=BinaryOp.Add, a=out, b=_per_channel(ctx, bias, rank, dtype))
    ctx.bind(node, out, index=0)
