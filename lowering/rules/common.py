"""Helpers that several rule families share."""

import operator
from typing import Optional

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from etmlx.serializer.generated.etmlx_ir import AsType, Scalar, SymSize, Take
from etmlx.serializer.ir import int_or_slot

from ..dtypes import fill_fields, ir_dtype


def out_dtype(node: fx.Node, index: int = 0) -> torch.dtype:
    value = node.meta["val"]
    return (value[index] if isinstance(value, (tuple, list)) else value).dtype


def dtype_of(arg) -> torch.dtype:
    return arg.meta["val"].dtype


def example_of(arg):
    """A node's example value (a fake tensor), or None for an absent optional argument."""
    return None if arg is None else arg.meta["val"]


def shape_of(arg) -> tuple:
    return tuple(arg.meta["val"].shape)


def rank_of(arg) -> int:
    return arg.meta["val"].dim()


def is_static(sizes) -> bool:
    return all(isinstance(size, int) for size in sizes)


def as_dtype(ctx, arg, dtype: torch.dtype):
    """``arg``'s slot in ``dtype``: a constant is converted at export, a Python
    scalar becomes a 0-d constant (one per value and dtype: each is an argument of the
    compiled graph on every call), and anything else gets an ``AsType`` node."""
    if not isinstance(arg, fx.Node):
        # repr, not the value: -0.0 == 0.0 and NaN != NaN, but neither may share a slot wrongly
        key = (Scalar, type(arg), repr(arg), dtype)
        return ctx.once(key, lambda: ctx.emit(Scalar, **fill_fields(arg, dtype)))
    if ctx.is_constant(arg):
        value = ctx.constant_values[arg]
        if value.dtype == dtype:
            return ctx.tensor(arg)
        return ctx.add_constant(value.to(dtype))
    if dtype_of(arg) == dtype:
        return ctx.tensor(arg)
    return ctx.emit(AsType, x=ctx.tensor(arg), dtype=ir_dtype(dtype))


def same_size(a, b) -> bool:
    """Whether two sizes (ints or SymInts) are provably equal for every input."""
    return statically_known_true(a == b)


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def reversed_along(ctx, slot, axis: int, size: int, count: Optional[int] = None):
    """The last ``count`` (default all) of ``size`` elements along ``axis``, last first:
    a gather with its index built at export."""
    count = size if count is None else count
    index = ctx.add_constant(torch.arange(size - 1, size - 1 - count, -1, dtype=torch.int32))
    return ctx.emit(Take, x=slot, indices=index, axis=axis)


def used_outputs(node: fx.Node) -> set:
    """Which results of a multi-output node its users read (they read them by getitem)."""
    return {user.args[1] for user in node.users}


def users_use_only_output(node: fx.Node, index: int = 0):
    """For multi-output ops etmlx lowers one result of: why not, or None."""
    for user in node.users:
        if user.target is not operator.getitem or user.args[1] != index:
            return f"a result other than output {index} is used; etmlx computes only that one"
    return None


def dim_size(ctx, x, axis: int):
    """The size of ``x`` along ``axis``: a literal when static, else read at run time."""
    size = shape_of(x)[axis]
    if isinstance(size, int):
        return int_or_slot(size)
    return ctx.emit(SymSize, x=ctx.tensor(x), axis=axis, outInt=ctx.new_int())
