"""Gathers and scatters by index arrays (``gather``, ``x[i, j]``, ``x[i] = v``), and
``copy``, which writes a whole tensor (a buffer update, say).

Indices are used as they are: like PyTorch, MLX wraps negative indices; unlike
PyTorch, it does not raise on an out-of-range index (see README, Limitations).
"""

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from etmlx.serializer.generated.etmlx_ir import AsType, BroadcastTo, Index, IndexPut, Slice, TakeAlongAxis
from etmlx.serializer.ir import int_or_slot

from ..dtypes import ir_dtype
from ..registry import lowers
from .common import normalize_axis, rank_of, shape_of

_INTEGER_INDEX = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _check_gather(node):
    x, dim, index = node.args[:3]
    axis = normalize_axis(dim, rank_of(x))
    for d, (size, bound) in enumerate(zip(shape_of(index), shape_of(x))):
        if d != axis and not statically_known_true(size == bound) and not isinstance(size, int):
            return "gather whose index is a dynamic sub-block of the input"
    return None


@lowers("aten::gather", check=_check_gather)
def _lower_gather(ctx, node):
    """PyTorch gathers from the leading sub-block of x that index covers; MLX's
    take_along_axis broadcasts instead, so x is first sliced to index's extent."""
    x, dim, index = node.args[:3]
    axis = normalize_axis(dim, rank_of(x))
    source = ctx.tensor(x)
    for d, (size, bound) in enumerate(zip(shape_of(index), shape_of(x))):
        if d != axis and not statically_known_true(size == bound):
            source = ctx.emit(Slice, x=source, axis=d, start=int_or_slot(0), stop=int_or_slot(size), step=1)
    ctx.bind(node, ctx.emit(TakeAlongAxis, x=source, indices=ctx.tensor(index), axis=axis))


def _check_indices(node):
    for index in node.args[1]:
        if index is not None and index.meta["val"].dtype not in _INTEGER_INDEX:
            return f"indexing with a {index.meta['val'].dtype} tensor (a boolean mask has a data-dependent shape)"
    return None


def _indexed(ctx, indices):
    dims = [d for d, index in enumerate(indices) if index is not None]
    return [ctx.tensor(indices[d]) for d in dims], dims


@lowers("aten::index.Tensor", check=_check_indices)
def _lower_index(ctx, node):
    x, indices = node.args[:2]
    slots, dims = _indexed(ctx, indices)
    ctx.bind(node, ctx.emit(Index, x=ctx.tensor(x), indices=slots, dims=dims))


def _check_index_put(node):
    values = node.args[2]
    if values.meta["val"].dtype != node.args[0].meta["val"].dtype:
        return "index_put of values in another dtype"
    return _check_indices(node)


@lowers("aten::index_put", check=_check_index_put)
def _lower_index_put(ctx, node):
    x, indices, values = node.args[:3]
    accumulate = bool(node.args[3]) if len(node.args) > 3 else bool(node.kwargs.get("accumulate", False))
    slots, dims = _indexed(ctx, indices)
    out = ctx.emit(
        IndexPut, x=ctx.tensor(x), indices=slots, dims=dims, values=ctx.tensor(values), accumulate=accumulate
    )
    ctx.bind(node, out)


def _check_copy(node):
    shape = shape_of(node.args[0])
    return None if all(isinstance(s, int) for s in shape) else "copy into a dynamic shape"


@lowers("aten::copy", check=_check_copy)
def _lower_copy(ctx, node):
    """``copy(self, src)`` is ``src`` cast to self's dtype and broadcast to its shape."""
    x, src = node.args[:2]
    value = ctx.tensor(src)
    if src.meta["val"].dtype != x.meta["val"].dtype:
        value = ctx.emit(AsType, x=value, dtype=ir_dtype(x.meta["val"].dtype))
    if shape_of(src) != shape_of(x):
        value = ctx.emit(BroadcastTo, x=value, shape=ctx.sizes(shape_of(x)))
    ctx.bind(node, value)
