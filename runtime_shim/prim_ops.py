"""Kernels the runtime implements itself, without torch.

These are the operators torch does not provide (``executorch_prim::*``, registered
only by executorch's Python package; ``dim_order_ops::*``), the shape queries, and
plain copies, so that a fully delegated program runs on numpy alone. Each kernel
takes the value table and the KernelCall's argument indices, laid out as the
emitter writes them: the schema's arguments in order, then the return value.
Scalar semantics follow ``exir/passes/executorch_prim_ops_registry.py`` (Python's).
"""

import math
import operator

import numpy as np

from .dtypes import BFLOAT16
from .tensor_value import TensorValue


def int_list(values: list, ref) -> list:
    """An IntList value's ints (its items are indices of Int values)."""
    return [values[i] for i in ref.items]


def _binary(fn):
    def kernel(values, args):
        a, b, out = args
        values[out] = fn(values[a], values[b])

    return kernel


def _unary(fn):
    def kernel(values, args):
        a, out = args
        values[out] = fn(values[a])

    return kernel


def _sym_ite(values, args):
    cond, if_true, if_false, out = args
    values[out] = values[if_true] if values[cond] else values[if_false]


def _sym_size(values, args):
    tensor, dim, out = args
    values[out] = values[tensor].shape[values[dim]]


def _sym_numel(values, args):
    tensor, out = args
    values[out] = values[tensor].numel


def _sym_stride(values, args):
    tensor, dim, out = args
    tv: TensorValue = values[tensor]
    stride = 1
    for d in reversed(tv.dim_order):  # innermost dimension last in dim_order
        if d == values[dim] % len(tv.shape):
            values[out] = stride
            return
        stride *= tv.shape[d]


def _local_scalar_dense(values, args):
    tensor, out = args
    values[out] = values[tensor].item()


def _et_view(values, args):
    """Make ``out`` a view of ``self`` with the requested sizes (one may be -1)."""
    src, sizes, out = args
    tv: TensorValue = values[src]
    shape = int_list(values, values[sizes])
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = tv.numel // known if known else 0
    values[out].alias(tv, shape)


def _et_copy_index(values, args):
    """``copy_to[index] = copy_from``, growing copy_to's first dim to index + 1 (map loops)."""
    copy_to, copy_from, index = args
    dst: TensorValue = values[copy_to]
    src: TensorValue = values[copy_from]
    i = values[index]
    dst.resize((i + 1,) + src.shape)
    dst.array[i] = src.array


def copy_cast(dst: TensorValue, src) -> None:
    """``dst[...] = src`` with dtype conversion and broadcasting, as torch's copy_ does."""
    if BFLOAT16 in (dst.dtype, src.dtype):  # numpy cannot convert bfloat16 bits
        dst.to_torch().copy_(src.to_torch())
    else:
        np.copyto(dst.array, src.array, casting="unsafe")


def _copy_out(values, args):
    """_to_dim_order_copy.out / _clone_dim_order.out: args (self, non_blocking, dim_order, out, ret).

    The dim order requested is the one serialized on ``out``, which ``.array`` honours.
    """
    src, _non_blocking, _dim_order, out, _ret = args
    values[out].resize(values[src].shape)
    copy_cast(values[out], values[src])


def _select_copy_out(values, args):
    """select_copy.int_out: args (self, dim, index, out, ret). One element of a size's
    source (``cache_position[-1]``, read by ``_local_scalar_dense`` to size an attention
    window): out-of-range indices raise as PyTorch's do."""
    src, dim, index, out, _ret = args
    tensor, axis, at = values[src], values[dim], values[index]
    size = tensor.shape[axis]
    if not -size <= at < size:
        raise IndexError(f"select(): index {at} out of range for a dimension of size {size}")
    values[out].set(np.take(tensor.array, at, axis=axis))


def _empty_out(values, args):
    size, _dim_order, out, _ret = args
    values[out].resize(int_list(values, values[size]))


def _copy_(values, args):
    """aten::copy_ (in place; used to write mutated buffers back): (self, src, non_blocking, ret)."""
    dst, src, _non_blocking, _ret = args
    copy_cast(values[dst], values[src])


def _python_mod(a, b):
    return int(a) % int(b)


_BINARY = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "floordiv": operator.floordiv,
    "truediv": operator.truediv,
    "mod": _python_mod,
    "sym_max": max,
    "sym_min": min,
    "eq": operator.eq,
    "gt": operator.gt,
    "lt": operator.lt,
    "ge": operator.ge,
    "le": operator.le,
}
_UNARY = {
    "neg": operator.neg,
    "ceil": math.ceil,
    "round": round,
    "trunc": math.trunc,
    "sym_float": float,
    "sym_int": int,
    "sym_not": operator.not_,
}

# qualified operator name -> (kernel, number of argument indices it takes)
KERNELS = {
    **{f"executorch_prim::{n}.Scalar": (_binary(fn), 3) for n, fn in _BINARY.items()},
    **{f"executorch_prim::{n}.Scalar": (_unary(fn), 2) for n, fn in _UNARY.items()},
    "executorch_prim::sym_ite.Scalar": (_sym_ite, 4),
    "executorch_prim::et_view.default": (_et_view, 3),
    "executorch_prim::et_copy_index.tensor": (_et_copy_index, 3),
    "aten::sym_size.int": (_sym_size, 3),
    "aten::sym_numel.default": (_sym_numel, 2),
    "aten::sym_stride.int": (_sym_stride, 3),
    "aten::_local_scalar_dense.default": (_local_scalar_dense, 2),
    "aten::copy_.default": (_copy_, 4),
    "dim_order_ops::_to_dim_order_copy.out": (_copy_out, 5),
    "dim_order_ops::_clone_dim_order.out": (_copy_out, 5),
    "dim_order_ops::_empty_dim_order.out": (_empty_out, 4),
    "aten::select_copy.int_out": (_select_copy_out, 5),
}
