"""Tensors created in the graph: fills, ranges, 0-d scalars, keyed random numbers."""

import torch
from torch import fx

from etmlx.serializer.generated.etmlx_ir import Arange, Full, RandomUniform, SizeScalar

from ..dtypes import fill_fields, ir_dtype
from ..registry import lowers
from .common import dim_size, example_of, out_dtype, rank_of


@lowers("aten::full")
def _lower_full(ctx, node, args):
    ctx.bind(node, ctx.emit(Full, shape=ctx.sizes(args.size), **fill_fields(args.fill_value, out_dtype(node))))


@lowers("aten::scalar_tensor")
def _lower_scalar_tensor(ctx, node, args):
    value, dtype = args.s, out_dtype(node)
    if isinstance(value, fx.Node):  # a size known only at run time
        ctx.bind(node, ctx.emit(SizeScalar, value=ctx.size(value), dtype=ir_dtype(dtype)))
    else:
        ctx.bind(node, ctx.emit(Full, shape=[], **fill_fields(value, dtype)))


@lowers("aten::full_like", "aten::fill.Scalar")
def _lower_full_like(ctx, node, args):
    """``fill(self, value)`` is a ``full_like`` too: a new array, MLX's being immutable."""
    x = args.self
    shape = [dim_size(ctx, x, axis) for axis in range(rank_of(x))]
    value = args.get("fill_value", args.get("value"))
    ctx.bind(node, ctx.emit(Full, shape=shape, **fill_fields(value, out_dtype(node))))


def _is_static(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _check_arange(node, args):
    if _is_static(args.start, args.end, args.step):
        return None
    if not isinstance(args.step, int) or any(isinstance(v, float) for v in (args.start, args.end)):
        return "arange of bounds known at run time with a dynamic step or non-integer bounds"
    return None


@lowers("aten::arange.start_step", check=_check_arange)
def _lower_arange(ctx, node, args):
    """A range of known bounds is a constant, computed by PyTorch (DINOv3's patch
    coordinates ``arange(0.5, n)`` and RoPE frequencies ``arange(0, 1, 4 / head_dim)``:
    float steps that an MLX range would round otherwise); one with a bound known only at
    run time is an Arange node."""
    if _is_static(args.start, args.end, args.step):
        ctx.bind(node, ctx.add_constant(torch.arange(args.start, args.end, args.step, dtype=out_dtype(node))))
        return
    out = ctx.emit(
        Arange, start=ctx.size(args.start), stop=ctx.size(args.end), step=args.step, dtype=ir_dtype(out_dtype(node))
    )
    ctx.bind(node, out)


def _check_random_uniform(node, args):
    seed = example_of(args.seed)
    if seed.dtype.is_floating_point or seed.dtype.is_complex or seed.dtype == torch.bool or seed.numel() != 1:
        return f"a seed of dtype {seed.dtype} and shape {tuple(seed.shape)} (one integer)"
    return None


@lowers("etmlx::random_uniform", check=_check_random_uniform)
def _lower_random_uniform(ctx, node, args):
    ctx.bind(node, ctx.emit(RandomUniform, seed=ctx.tensor(args.seed), shape=ctx.sizes(args.shape)))
