"""Gathers and scatters by index arrays: Take, TakeAlongAxis, Index, IndexPut, and the
bounds check CheckIndex.

Every gather and scatter clamps its indices into the axis it reads (negative ones
counted from the end) before MLX sees them, whatever the payload holds: MLX reads
whatever memory an index points at. CheckIndex, which lowering puts before indices
known only at run time, is what reports an out-of-range one as PyTorch would; the clamp
only keeps a damaged or crafted payload from reading out of bounds.
"""

import mlx.core as mx
import numpy as np

from etmlx.serializer.generated.etmlx_ir.ScatterReduce import ScatterReduce

from ..errors import IndexRangeError


def _in_bounds(indices: mx.array, size: int) -> mx.array:
    """``indices`` into an axis of ``size`` elements, made safe to gather with."""
    if not mx.issubdtype(indices.dtype, mx.integer):
        raise TypeError(f"indices of dtype {indices.dtype}")
    if indices.size == 0:
        return indices
    if size == 0:
        raise ValueError("indices into a dimension of size 0")
    if indices.dtype not in (mx.int32, mx.int64):
        indices = indices.astype(mx.int64)  # room for -size .. size - 1
    # MLX's gathers and scatters count negative indices from the end themselves. (Indices
    # cast from floats are defined values: AsType saturates, see elementwise.py.)
    return mx.clip(indices, -size, size - 1)


def _axis_size(x: mx.array, axis: int) -> int:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} out of range for an array of {x.ndim} dimensions")
    return x.shape[axis]


def _key(op, env) -> tuple:
    x, dims = env.t(op.x), list(op.dims)
    if not dims or dims != sorted(set(dims)) or dims[0] < 0 or dims[-1] >= x.ndim or len(dims) != len(op.indices):
        raise ValueError(f"index dims {dims} do not ascend within {x.ndim} dimensions")
    key = [slice(None)] * (dims[-1] + 1)
    for dim, ref in zip(dims, op.indices):
        key[dim] = _in_bounds(env.t(ref), x.shape[dim])
    return tuple(key)


def _take(op, env):
    x = env.t(op.x)
    return mx.take(x, _in_bounds(env.t(op.indices), _axis_size(x, op.axis)), axis=op.axis)


def _take_along_axis(op, env):
    x = env.t(op.x)
    return mx.take_along_axis(x, _in_bounds(env.t(op.indices), _axis_size(x, op.axis)), axis=op.axis)


_REDUCTIONS = {ScatterReduce.Multiply: "multiply", ScatterReduce.Maximum: "maximum", ScatterReduce.Minimum: "minimum"}


def _index_put(op, env):
    x, key, values = env.t(op.x), _key(op, env), env.t(op.values)
    if op.reduce != ScatterReduce.None_:
        if op.accumulate:
            raise ValueError("an IndexPut that both accumulates and reduces")
        return getattr(x.at[key], _REDUCTIONS[op.reduce])(values)
    if op.accumulate:
        return x.at[key].add(values)
    out = mx.array(x)  # a new array: assigning to it leaves x (maybe a buffer's old state) alone
    out[key] = values
    return out


def _check_index(op, env):
    """Passes the indices on, and records them with their bound: the runtime checks
    them on the host once the call is evaluated (see CheckIndex in schema.fbs)."""
    indices = env.t(op.indices)
    if not mx.issubdtype(indices.dtype, mx.integer):
        raise TypeError(f"indices of dtype {indices.dtype}")
    env.checks.append((indices, env.size(op.size)))
    return indices


def first_out_of_range(indices: mx.array, size: int, wraps: bool):
    """The first index (in row-major order) of evaluated ``indices`` outside the range
    PyTorch accepts, or None."""
    low = -size if wraps else 0
    if indices.size == 1:  # a token id, a cache position: no numpy round trip
        value = indices.item()
        return None if low <= value < size else value
    flat = np.asarray(indices).reshape(-1)
    bad = (flat < low) | (flat >= size)  # comparisons only: no overflow
    return int(flat[bad.argmax()]) if bad.any() else None


def index_error(op, first: int, size: int) -> IndexRangeError:
    """The error a failed CheckIndex raises, in PyTorch's terms."""
    valid = "none" if size == 0 else f"{-size if op.wraps else 0} to {size - 1}"
    return IndexRangeError(
        f"{op.what} holds index {first}, out of range for a dimension of size {size} (valid: {valid})"
    )


HANDLERS = {
    "CheckIndex": _check_index,
    "Take": _take,
    "TakeAlongAxis": _take_along_axis,
    "Index": lambda op, env: env.t(op.x)[_key(op, env)],
    "IndexPut": _index_put,
}
