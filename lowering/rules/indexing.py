"""Gathers and scatters by index arrays (``embedding``, ``gather``, ``x[i, j]``,
``x[i] = v``), and ``copy``, which writes a whole tensor (a buffer update, say).

Indices known only at run time go through a ``CheckIndex`` node first: MLX reads
whatever memory an index points at, while PyTorch raises ``IndexError``. The check
keeps PyTorch's meaning of negative indices per operator (``x[i]`` and ``index_put``
count them from the end; ``embedding``, ``index_select`` and ``gather`` reject them)
and costs nothing where the indices are provably in range.
"""

import math
import operator

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from etmlx.serializer.generated.etmlx_ir import (
    AsType, Binary, BroadcastTo, CheckIndex, ExpandDims, Full, Index, IndexPut, Reshape, Scan, Slice, Take,
    TakeAlongAxis, Unary, Where,
)
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.ScanOp import ScanOp
from etmlx.serializer.generated.etmlx_ir.ScatterReduce import ScatterReduce
from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp
from etmlx.serializer.ir import int_or_slot

from ..arguments import bind
from ..dtypes import fill_fields, ir_dtype
from ..registry import is_call, lowers, op_name
from .common import as_dtype, dim_size, dtype_of, is_static, normalize_axis, rank_of, shape_of

_INTEGER_INDEX = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


# Operators that pass indices through unchanged, so an index's origin is their input's.
_PASS_THROUGH = ("aten::_to_copy", "dim_order_ops::_to_dim_order_copy", "aten::clone", "dim_order_ops::_clone_dim_order")


def checked_index(ctx, index: fx.Node, x: fx.Node, axis: int, wraps: bool):
    """The slot of ``index`` (indices into ``axis`` of ``x``), through a ``CheckIndex``
    unless the indices are provably in range; one check per indices and bound."""
    size = shape_of(x)[axis]
    if _provably_in_range(ctx, index, size, wraps):
        return ctx.tensor(index)
    bound = size if isinstance(size, int) else (x, axis)  # a symbolic size: checked per tensor
    return ctx.once(
        (CheckIndex, index, bound, wraps),
        lambda: ctx.emit(
            CheckIndex, indices=ctx.tensor(index), size=dim_size(ctx, x, axis), wraps=wraps, what=_origin(ctx, index)
        ),
    )


def _provably_in_range(ctx, index: fx.Node, size, wraps: bool) -> bool:
    if not isinstance(size, int):
        return False
    low = -size if wraps else 0
    if ctx.is_constant(index):
        values = ctx.constant_values[index]
        return values.numel() == 0 or bool(((values >= low) & (values < size)).all())
    if index.op == "call_function" and op_name(index.target) == "aten::arange.start_step":
        arange = bind(index)
        start, end, step = arange.start, arange.end, arange.step
        if all(isinstance(v, int) for v in (start, end, step)) and step > 0:
            return end <= start or (start >= low and end - 1 < size)
    positions = sorted_positions_bound(index)
    return positions is not None and positions <= size


# Operators whose result holds only values of their input (shape changes), so positions
# stay positions through them.
_REARRANGING = (
    "aten::view_copy", "aten::reshape", "aten::unsqueeze_copy", "aten::squeeze_copy.dims", "aten::squeeze_copy.dim",
    "aten::permute_copy", "aten::expand_copy", "aten::slice_copy.Tensor", "aten::select_copy.int",
    "aten::clone", "dim_order_ops::_clone_dim_order",
)


# Ops whose result holds only values of their first operand.
_KEEPING_VALUES = (*_REARRANGING, *_PASS_THROUGH, "aten::index.Tensor")


def sorted_positions_bound(index: fx.Node):
    """n when ``index`` holds positions along an axis of n elements by construction (the
    indices of ``sort``/``topk``, maybe reshaped, cast, or some of them gathered: a
    router's chosen experts, in the order ExecuTorch's MLX delegate sorts them), else None."""
    while index.op == "call_function" and op_name(index.target) in _KEEPING_VALUES:
        index = index.args[0]
    if index.op != "call_function" or index.target is not operator.getitem or index.args[1] != 1:
        return None
    source = index.args[0]
    if not is_call(source, "aten::topk", "aten::sort"):
        return None
    sorted_along = bind(source)
    size = shape_of(sorted_along.self)[normalize_axis(sorted_along.dim, rank_of(sorted_along.self))]
    return size if isinstance(size, int) else None


def _origin(ctx, index: fx.Node) -> str:
    """Where the indices come from, for the IndexError: the delegate's input they are
    (a method input when the method is one delegate), or the inputs they are computed
    from (a KV cache's write positions from ``cache_position``, say)."""
    while index.op == "call_function" and op_name(index.target) in _PASS_THROUGH:
        index = bind(index).self
    if index.op == "placeholder":
        return f"input '{index.name}'"
    inputs = sorted(
        node.name
        for node in _ancestors(index)
        if node.op == "placeholder" and not ctx.is_constant(node) and not ctx.is_buffer(node)
    )
    if not inputs:
        return f"the index computed by {index.name}"
    return f"an index computed from input{'s' if len(inputs) > 1 else ''} " + ", ".join(f"'{n}'" for n in inputs)


def _ancestors(node: fx.Node) -> set:
    seen, pending = set(), [node]
    while pending:
        for parent in pending.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                pending.append(parent)
    return seen


@lowers("aten::embedding")
def _lower_embedding(ctx, node, args):
    weight, indices = args.weight, args.indices
    checked = checked_index(ctx, indices, weight, 0, wraps=False)  # PyTorch rejects negative ids
    ctx.bind(node, ctx.emit(Take, x=ctx.tensor(weight), indices=checked, axis=0))


@lowers("aten::index_select")
def _lower_index_select(ctx, node, args):
    x, dim, index = args.self, args.dim, args.index
    axis = normalize_axis(dim, rank_of(x))
    checked = checked_index(ctx, index, x, axis, wraps=False)
    ctx.bind(node, ctx.emit(Take, x=ctx.tensor(x), indices=checked, axis=axis))


def _check_gather(node, args):
    x, dim, index = args.self, args.dim, args.index
    axis = normalize_axis(dim, rank_of(x))
    for d, (size, bound) in enumerate(zip(shape_of(index), shape_of(x))):
        if d != axis and not statically_known_true(size == bound) and not isinstance(size, int):
            return "gather whose index is a dynamic sub-block of the input"
    return None


@lowers("aten::gather", check=_check_gather)
def _lower_gather(ctx, node, args):
    """PyTorch gathers from the leading sub-block of x that index covers; MLX's
    take_along_axis broadcasts instead, so x is first sliced to index's extent."""
    x, dim, index = args.self, args.dim, args.index
    axis = normalize_axis(dim, rank_of(x))
    source = ctx.tensor(x)
    for d, (size, bound) in enumerate(zip(shape_of(index), shape_of(x))):
        if d != axis and not statically_known_true(size == bound):
            source = ctx.emit(Slice, x=source, axis=d, start=int_or_slot(0), stop=int_or_slot(size), step=1)
    indices = checked_index(ctx, index, x, axis, wraps=False)
    ctx.bind(node, ctx.emit(TakeAlongAxis, x=source, indices=indices, axis=axis))


def _check_indices(node, args):
    for index in args.indices:
        if index is not None and index.meta["val"].dtype not in _INTEGER_INDEX:
            return f"indexing with a {index.meta['val'].dtype} tensor (a boolean mask has a data-dependent shape)"
    return None


def _indexed(ctx, x, indices):
    """Checked slots of the index tensors, and the dims they index; negative indices
    count from the end, as in ``x[i]``."""
    dims = [d for d, index in enumerate(indices) if index is not None]
    return [checked_index(ctx, indices[d], x, d, wraps=True) for d in dims], dims


@lowers("aten::index.Tensor", check=_check_indices)
def _lower_index(ctx, node, args):
    slots, dims = _indexed(ctx, args.self, args.indices)
    ctx.bind(node, ctx.emit(Index, x=ctx.tensor(args.self), indices=slots, dims=dims))


def _check_index_put(node, args):
    if dtype_of(args.values) != dtype_of(args.self):
        return "index_put of values in another dtype"
    return _check_indices(node, args)


@lowers("aten::index_put", check=_check_index_put)
def _lower_index_put(ctx, node, args):
    x = args.self
    slots, dims = _indexed(ctx, x, args.indices)
    out = ctx.emit(
        IndexPut, x=ctx.tensor(x), indices=slots, dims=dims, values=ctx.tensor(args.values),
        accumulate=bool(args.accumulate),
    )
    ctx.bind(node, out)


def _check_scatter(node, args):
    if rank_of(args.self) == 0 or not is_static(shape_of(args.index)):
        return f"{op_name(node.target)} of a 0-d tensor, or with a dynamic index shape"
    if args.get("src") is not None and not is_static(shape_of(args.src)):
        return f"{op_name(node.target)} with a dynamic source shape"
    return None


@lowers("aten::scatter_add", check=_check_scatter)
def _lower_scatter_add(ctx, node, args):
    """``self[..., index[i, j], ...] += src[i, j]`` along ``dim``. (Sums of duplicate
    positions may round in another order than PyTorch's.)"""
    ctx.bind(node, _scatter(ctx, args, _source_block(ctx, args), ctx.tensor(args.self), accumulate=True))


@lowers("aten::scatter.value", check=_check_scatter)
def _lower_scatter_value(ctx, node, args):
    """``self[..., index[i, j], ...] = value`` along ``dim``: exact even where ``index``
    repeats a position (which PyTorch leaves unspecified for ``scatter.src``), since
    every write there is the same value."""
    ctx.bind(node, _scatter(ctx, args, _filled(ctx, args, args.value), ctx.tensor(args.self)))


_REDUCTIONS = {
    "sum": ScatterReduce.None_, "mean": ScatterReduce.None_, "prod": ScatterReduce.Multiply,
    "amax": ScatterReduce.Maximum, "amin": ScatterReduce.Minimum,
}


def _check_scatter_reduce(node, args):
    if args.reduce not in _REDUCTIONS:
        return f"scatter_reduce with reduce={args.reduce!r}"
    if dtype_of(args.self) == torch.bool:
        return "scatter_reduce of booleans"
    return _check_scatter(node, args)


@lowers("aten::scatter_reduce.two", check=_check_scatter_reduce)
def _lower_scatter_reduce(ctx, node, args):
    """``src`` combined into ``self`` at ``index`` by a sum, product, mean, max or min,
    ``self``'s own element included or not (``include_self``). Without it, a position
    written starts from 0 (sum, mean) or 1 (prod), or from one of its own values (max,
    min: taking one twice changes nothing). MLX's scatter-max/min keep a number over a
    NaN already there; PyTorch's give NaN, which is put back where a NaN took part. The
    mean divides by the count of values combined (at least 1), flooring integers as
    PyTorch does. (Sums and products of repeated positions may round in another order.)"""
    values, reduce, x = _source_block(ctx, args), args.reduce, ctx.tensor(args.self)
    if not args.include_self:
        start = values if reduce in ("amax", "amin") else _filled(ctx, args, 1 if reduce == "prod" else 0)
        x = _scatter(ctx, args, start, x)
    combined = _scatter(ctx, args, values, x, accumulate=reduce in ("sum", "mean"), reduce=_REDUCTIONS[reduce])
    dtype = dtype_of(args.self)
    if reduce in ("amax", "amin") and dtype.is_floating_point:
        combined = _with_nans(ctx, args, values, combined)
    if reduce == "mean":
        no_counts = ctx.emit(Full, shape=ctx.sizes(shape_of(args.self)), **fill_fields(int(args.include_self), dtype))
        counts = _scatter(ctx, args, _filled(ctx, args, 1), no_counts, accumulate=True)
        counts = ctx.emit(Binary, op=BinaryOp.Maximum, a=counts, b=as_dtype(ctx, 1, dtype))
        divide = BinaryOp.Div if dtype.is_floating_point else BinaryOp.FloorDivide
        combined = ctx.emit(Binary, op=divide, a=combined, b=counts)
    ctx.bind(node, combined)


def _with_nans(ctx, args, values, combined):
    """``combined`` with NaN wherever a NaN of ``values`` landed, or (``include_self``)
    where ``self`` holds one."""
    landed = ctx.emit(AsType, x=ctx.emit(Unary, op=UnaryOp.IsNan, x=values), dtype=ir_dtype(torch.int32))
    nowhere = ctx.emit(Full, shape=ctx.sizes(shape_of(args.self)), **fill_fields(0, torch.int32))
    hit = _scatter(ctx, args, landed, nowhere, reduce=ScatterReduce.Maximum)
    nan = ctx.emit(AsType, x=hit, dtype=ir_dtype(torch.bool))
    if args.include_self:
        nan = ctx.emit(Binary, op=BinaryOp.LogicalOr, a=nan, b=ctx.emit(Unary, op=UnaryOp.IsNan, x=ctx.tensor(args.self)))
    return ctx.emit(Where, cond=nan, a=as_dtype(ctx, float("nan"), dtype_of(args.self)), b=combined)


def _source_block(ctx, args):
    """The block of ``src`` PyTorch reads: the index's extent, which may be smaller."""
    values = ctx.tensor(args.src)
    for d, (used, available) in enumerate(zip(shape_of(args.index), shape_of(args.src))):
        if used != available:
            values = ctx.emit(Slice, x=values, axis=d, start=int_or_slot(0), stop=int_or_slot(used), step=1)
    return values


def _filled(ctx, args, value):
    """``value`` in ``self``'s dtype, shaped as ``index``."""
    return ctx.emit(Full, shape=ctx.sizes(shape_of(args.index)), **fill_fields(value, dtype_of(args.self)))


def _scatter(ctx, args, values, into, accumulate: bool = False, reduce=ScatterReduce.None_):
    """An IndexPut of ``values`` (shaped as ``index``) into ``into`` (shaped as
    ``self``) at ``index`` along ``dim``, the other dims indexed by aranges over the
    index's extent; one bounds check for every scatter at this index."""
    x, index = args.self, args.index
    rank, axis = rank_of(x), normalize_axis(args.dim, rank_of(x))
    extent = shape_of(index)
    slots = []
    for d in range(rank):
        if d == axis:
            slots.append(checked_index(ctx, index, x, axis, wraps=False))  # PyTorch rejects negative ones
        else:
            grid = torch.arange(extent[d], dtype=torch.int32).reshape([-1 if e == d else 1 for e in range(rank)])
            slots.append(ctx.once(("scatter grid", extent, d), lambda: ctx.add_constant(grid)))
    return ctx.emit(
        IndexPut, x=into, indices=slots, dims=list(range(rank)), values=values, accumulate=accumulate, reduce=reduce
    )


def _check_masked_scatter(node, args):
    shapes = (shape_of(args.self), shape_of(args.mask), shape_of(args.source))
    if not all(is_static(shape) for shape in shapes):
        return "masked_scatter of a dynamic shape"
    return None


@lowers("aten::masked_scatter", check=_check_masked_scatter)
def _lower_masked_scatter(ctx, node, args):
    """The k-th position (row-major) where the mask is true takes element k of the
    flattened source, the others keep self's: k is the running count of true elements
    less one, a gather bounds-checked against the source's size (PyTorch's error when
    the source is too small)."""
    x, shape = args.self, shape_of(args.self)
    flat = [int_or_slot(-1)]
    mask = ctx.emit(BroadcastTo, x=ctx.tensor(args.mask), shape=[int_or_slot(s) for s in shape])
    mask = ctx.emit(Reshape, x=mask, shape=flat)
    running = ctx.emit(Scan, op=ScanOp.CumSum, x=ctx.emit(AsType, x=mask, dtype=ir_dtype(torch.int32)), axis=0)
    minus_one = ctx.emit(Binary, op=BinaryOp.Sub, a=running, b=as_dtype(ctx, 1, torch.int32))
    at = ctx.emit(Where, cond=mask, a=minus_one, b=as_dtype(ctx, 0, torch.int32))
    at = ctx.emit(CheckIndex, indices=at, size=int_or_slot(math.prod(shape_of(args.source))), wraps=False,
                  what=f"masked_scatter's count of true elements of {_origin(ctx, args.mask)}")
    taken = ctx.emit(Take, x=ctx.emit(Reshape, x=ctx.tensor(args.source), shape=flat), indices=at, axis=0)
    out = ctx.emit(Where, cond=mask, a=taken, b=ctx.emit(Reshape, x=ctx.tensor(x), shape=flat))
    ctx.bind(node, ctx.emit(Reshape, x=out, shape=[int_or_slot(s) for s in shape]))


def _scattered_positions(args):
    """The positions along ``dim`` a slice_scatter or select_scatter writes, or None
    when they are not known at export."""
    size = shape_of(args.self)[normalize_axis(args.dim, rank_of(args.self))]
    if not isinstance(size, int):
        return None
    index = args.get("index")  # select_scatter's; slice_scatter has start, end and step
    if index is not None:
        return [index % size] if isinstance(index, int) else None
    bounds = (args.start, args.end, args.step)
    if not all(b is None or isinstance(b, int) for b in bounds):
        return None
    return list(range(size))[slice(*bounds)]


def _check_scatter_slice(node, args):
    if _scattered_positions(args) is None:
        return f"{op_name(node.target)} of a dynamic size or position"
    return None


@lowers("aten::slice_scatter", "aten::select_scatter", check=_check_scatter_slice)
def _lower_scatter_slice(ctx, node, args):
    """``self`` with ``src`` written at the positions a slice (or one index) of ``dim``
    selects: an IndexPut with those positions as a constant index array."""
    x, axis = args.self, normalize_axis(args.dim, rank_of(args.self))
    values = ctx.tensor(args.src)
    if args.get("index") is not None:  # select_scatter: src lacks the selected dim
        values = ctx.emit(ExpandDims, x=values, axes=[axis])
    positions = ctx.add_constant(torch.tensor(_scattered_positions(args), dtype=torch.int32))
    out = ctx.emit(IndexPut, x=ctx.tensor(x), indices=[positions], dims=[axis], values=values, accumulate=False)
    ctx.bind(node, out)


def _check_copy(node, args):
    """A dynamic shape is broadcast to only from the same shape (Qwen3.5's rotary
    sections, written into slices of a tensor as long as the call)."""
    if is_static(shape_of(args.self)) or shape_of(args.src) == shape_of(args.self):
        return None
    return "copy into a dynamic shape from another shape"


@lowers("aten::copy", check=_check_copy)
def _lower_copy(ctx, node, args):
    """``copy(self, src)`` is ``src`` cast to self's dtype and broadcast to its shape."""
    x, src = args.self, args.src
    value = ctx.tensor(src)
    if dtype_of(src) != dtype_of(x):
        value = ctx.emit(AsType, x=value, dtype=ir_dtype(dtype_of(x)))
    if shape_of(src) != shape_of(x):
        value = ctx.emit(BroadcastTo, x=value, shape=ctx.sizes(shape_of(x)))
    ctx.bind(node, value)
