"""Reshapes, permutations, slicing, padding, concatenation, repeats and gathers.

Sizes may be SymInts (dynamic dims): they reach the IR as int slots, read at run time.
"""

import math

import torch

from etmlx.serializer.generated.etmlx_ir import (
    AsType,
    Binary,
    BroadcastTo,
    Concatenate,
    ExpandDims,
    Pad,
    Reshape,
    Slice,
    Squeeze,
    Take,
    Tile,
    Transpose,
)
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.ir import int_or_slot

from ..dtypes import dtype_name, ir_dtype
from ..registry import lowers, op_name
from .common import as_dtype, dim_size, dtype_of, is_static, normalize_axis, out_dtype, rank_of, reversed_along, shape_of
from .separable import axis_matrices, lower_per_axis

INT64_MAX = 2**63 - 1


@lowers("aten::view_copy", "aten::_unsafe_view", "aten::reshape")
def _lower_view(ctx, node, args):
    sizes = args.get("size", args.get("shape"))  # reshape names it ``shape``
    ctx.bind(node, ctx.emit(Reshape, x=ctx.tensor(args.self), shape=ctx.sizes(sizes)))


@lowers("aten::permute_copy")
def _lower_permute(ctx, node, args):
    rank = rank_of(args.self)
    ctx.bind(node, ctx.emit(Transpose, x=ctx.tensor(args.self), perm=[normalize_axis(d, rank) for d in args.dims]))


def _swap(rank: int, a: int, b: int) -> list:
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return perm


@lowers("aten::t_copy")
def _lower_t(ctx, node, args):
    x = args.self
    if rank_of(x) < 2:
        ctx.bind(node, ctx.tensor(x))
    else:
        ctx.bind(node, ctx.emit(Transpose, x=ctx.tensor(x), perm=[1, 0]))


@lowers("aten::transpose_copy.int")
def _lower_transpose(ctx, node, args):
    rank = rank_of(args.self)
    perm = _swap(rank, normalize_axis(args.dim0, rank), normalize_axis(args.dim1, rank))
    ctx.bind(node, ctx.emit(Transpose, x=ctx.tensor(args.self), perm=perm))


@lowers("aten::unsqueeze_copy")
def _lower_unsqueeze(ctx, node, args):
    axis = normalize_axis(args.dim, rank_of(args.self) + 1)
    ctx.bind(node, ctx.emit(ExpandDims, x=ctx.tensor(args.self), axes=[axis]))


def _squeeze_dims(args) -> list:
    """The axes a squeeze names (``squeeze_copy`` names none: all of them)."""
    rank = rank_of(args.self)
    if not rank:
        return []
    dims = args.get("dim", range(rank))
    return sorted({normalize_axis(d, rank) for d in (dims if isinstance(dims, (list, tuple, range)) else [dims])})


def _check_squeeze(node, args):
    shape = shape_of(args.self)
    if not all(isinstance(shape[axis], int) for axis in _squeeze_dims(args)):
        return "squeeze of a dynamic dim (whether it is 1 is known only at run time)"
    return None


@lowers("aten::squeeze_copy.dims", "aten::squeeze_copy.dim", "aten::squeeze_copy", check=_check_squeeze)
def _lower_squeeze(ctx, node, args):
    shape = shape_of(args.self)
    axes = [axis for axis in _squeeze_dims(args) if shape[axis] == 1]
    x = ctx.tensor(args.self)
    ctx.bind(node, ctx.emit(Squeeze, x=x, axes=axes) if axes else x)


@lowers("aten::expand_copy")
def _lower_expand(ctx, node, args):
    x, sizes = args.self, args.size
    offset = len(sizes) - rank_of(x)
    shape = []
    for i, size in enumerate(sizes):
        if isinstance(size, int) and size == -1:
            shape.append(dim_size(ctx, x, i - offset))
        else:
            shape.append(ctx.size(size))
    ctx.bind(node, ctx.emit(BroadcastTo, x=ctx.tensor(x), shape=shape))


def _slice(ctx, x, axis, start, stop, step=1):
    return ctx.emit(Slice, x=ctx.tensor(x), axis=axis, start=ctx.size(start), stop=ctx.size(stop), step=step)


def _check_slice(node, args):
    return None if isinstance(args.step, int) and args.step > 0 else "slice with a non-positive or dynamic step"


@lowers("aten::slice_copy.Tensor", check=_check_slice)
def _lower_slice(ctx, node, args):
    axis = normalize_axis(args.dim, rank_of(args.self))
    start = 0 if args.start is None else args.start
    end = INT64_MAX if args.end is None else args.end
    ctx.bind(node, _slice(ctx, args.self, axis, start, end, args.step))


def _check_select(node, args):
    x, dim, index = args.self, args.dim, args.index
    size = shape_of(x)[normalize_axis(dim, rank_of(x))]
    if not isinstance(index, int) or (index < 0 and not isinstance(size, int)):
        return "select with a dynamic index, or a negative one on a dynamic dim"
    return None


@lowers("aten::select_copy.int", check=_check_select)
def _lower_select(ctx, node, args):
    x, dim, index = args.self, args.dim, args.index
    axis = normalize_axis(dim, rank_of(x))
    if index < 0:
        index += shape_of(x)[axis]
    sliced = _slice(ctx, x, axis, index, index + 1)
    ctx.bind(node, ctx.emit(Squeeze, x=sliced, axes=[axis]))


def _split_bounds(sizes):
    start = 0
    for size in sizes:
        yield start, start + size
        start += size


def _check_static_split_dim(node, args):
    if not isinstance(shape_of(args.self)[normalize_axis(args.dim, rank_of(args.self))], int):
        return f"{op_name(node.target)} along a dynamic dim"
    return None


@lowers("aten::split_with_sizes_copy", "aten::split_copy.Tensor", check=_check_static_split_dim)
def _lower_split(ctx, node, args):
    x = args.self
    split = args.get("split_size", args.get("split_sizes"))
    axis = normalize_axis(args.dim, rank_of(x))
    if isinstance(split, int):
        total = shape_of(x)[axis]
        split = [min(split, total - s) for s in range(0, total, split)]
    for index, (start, stop) in enumerate(_split_bounds(split)):
        ctx.bind(node, _slice(ctx, x, axis, start, stop), index=index)


@lowers("aten::unbind_copy.int", check=_check_static_split_dim)
def _lower_unbind(ctx, node, args):
    x = args.self
    axis = normalize_axis(args.dim, rank_of(x))
    for index in range(shape_of(x)[axis]):
        sliced = _slice(ctx, x, axis, index, index + 1)
        ctx.bind(node, ctx.emit(Squeeze, x=sliced, axes=[axis]), index=index)


@lowers("aten::cat")
def _lower_cat(ctx, node, args):
    tensors = [t for t in args.tensors if shape_of(t) != (0,)]  # PyTorch skips legacy empty 1-d tensors
    axis = normalize_axis(args.dim, rank_of(node))
    ctx.bind(node, ctx.emit(Concatenate, xs=[ctx.tensor(t) for t in tensors], axis=axis))


def _check_repeat(node, args):
    return None if is_static(args.repeats) else "repeat by a dynamic count"


@lowers("aten::repeat", check=_check_repeat)
def _lower_repeat(ctx, node, args):
    ctx.bind(node, ctx.emit(Tile, x=ctx.tensor(args.self), reps=list(args.repeats)))


@lowers("aten::clone", "dim_order_ops::_clone_dim_order", "aten::alias_copy", "aten::detach_copy")
def _lower_alias(ctx, node, args):
    """MLX arrays are immutable, so a copy needs no node: the result is the operand."""
    ctx.bind(node, ctx.tensor(args.self))


@lowers("aten::_to_copy", "dim_order_ops::_to_dim_order_copy")
def _lower_to_copy(ctx, node, args):
    x = args.self
    dtype = out_dtype(node)
    if dtype == x.meta["val"].dtype:
        ctx.bind(node, ctx.tensor(x))
    else:
        ctx.bind(node, ctx.emit(AsType, x=ctx.tensor(x), dtype=ir_dtype(dtype)))


def _check_pad(node, args):
    return None if is_static(args.pad) else "dynamic padding"


@lowers("aten::constant_pad_nd", check=_check_pad)
def _lower_pad(ctx, node, args):
    """PyTorch lists (before, after) pairs from the last axis backwards; MLX per axis.
    A negative width crops that side, as in PyTorch: a Slice before the Pad. (ExecuTorch's
    own kernel rejects negative widths, so declining would leave the program unrunnable
    on its runtime.)"""
    x, pad = args.self, args.pad
    out = ctx.tensor(x)
    pairs = [(0, 0)] * rank_of(x)
    for i in range(len(pad) // 2):
        axis, before, after = rank_of(x) - 1 - i, pad[2 * i], pad[2 * i + 1]
        if before < 0 or after < 0:
            stop = after if after < 0 else INT64_MAX  # a negative stop counts from the end
            out = ctx.emit(Slice, x=out, axis=axis, start=ctx.size(max(0, -before)), stop=ctx.size(stop), step=1)
        pairs[axis] = (max(0, before), max(0, after))
    if any(pair != (0, 0) for pair in pairs):
        out = ctx.emit(Pad, x=out, padWidth=[p for pair in pairs for p in pair], value=float(args.value))
    ctx.bind(node, out)


def _check_flip(node, args):
    x, dims = args.self, args.dims
    if not all(isinstance(shape_of(x)[normalize_axis(d, rank_of(x))], int) for d in dims):
        return "flip along a dynamic dim"
    return None


@lowers("aten::flip", check=_check_flip)
def _lower_flip(ctx, node, args):
    """A gather with a reversed index, built at export."""
    x, dims = args.self, args.dims
    out = ctx.tensor(x)
    for d in sorted({normalize_axis(d, rank_of(x)) for d in dims}):
        out = reversed_along(ctx, out, d, shape_of(x)[d])
    ctx.bind(node, out)


EDGE_PADS = {
    "aten::reflection_pad1d": "reflect", "aten::reflection_pad2d": "reflect", "aten::reflection_pad3d": "reflect",
    "aten::replication_pad1d": "replicate", "aten::replication_pad2d": "replicate",
    "aten::replication_pad3d": "replicate",
}


def _check_edge_pad(node, args):
    shape = shape_of(args.self)
    padded = shape[len(shape) - len(args.padding) // 2:]
    if not is_static(args.padding) or not is_static(padded) or min(args.padding) < 0:
        return "reflection or replication padding of a dynamic size, or negative padding"
    return None


def _edge_index(size: int, before: int, after: int, mode: str) -> torch.Tensor:
    """Which input position each padded position reads along one axis."""
    positions = torch.arange(-before, size + after)
    if mode == "replicate":
        return positions.clamp(0, size - 1)
    reflected = positions.abs()
    return torch.where(reflected > size - 1, 2 * (size - 1) - reflected, reflected)


@lowers(*EDGE_PADS, check=_check_edge_pad)
def _lower_edge_pad(ctx, node, args):
    """A gather per padded axis with indices computed at export (PyTorch rejects a
    reflection as wide as the axis, so every index is in range)."""
    x, pad = args.self, args.padding
    out = ctx.tensor(x)
    for i in range(len(pad) // 2):
        axis = rank_of(x) - 1 - i
        index = _edge_index(shape_of(x)[axis], pad[2 * i], pad[2 * i + 1], EDGE_PADS[node.target.name()])
        out = ctx.emit(Take, x=out, indices=ctx.add_constant(index.to(torch.int32)), axis=axis)
    ctx.bind(node, out)


def _diagonal_axes(args):
    rank = rank_of(args.self)
    return normalize_axis(args.dim1, rank), normalize_axis(args.dim2, rank)


def _check_diagonal(node, args):
    shape = shape_of(args.self)
    return None if is_static([shape[axis] for axis in _diagonal_axes(args)]) else "diagonal of a dynamic plane"


@lowers("aten::diagonal_copy", check=_check_diagonal)
def _lower_diagonal(ctx, node, args):
    """The (dim1, dim2) plane moved last and flattened, then a gather of its diagonal at
    indices computed at export; the diagonal becomes the last dim, as in PyTorch."""
    x, offset = args.self, args.offset
    first, second = _diagonal_axes(args)
    rows, cols = shape_of(x)[first], shape_of(x)[second]
    row, col = max(0, -offset), max(0, offset)
    steps = torch.arange(max(0, min(rows - row, cols - col)))
    others = [axis for axis in range(rank_of(x)) if axis not in (first, second)]
    moved = ctx.emit(Transpose, x=ctx.tensor(x), perm=others + [first, second])
    plane = ctx.emit(Reshape, x=moved, shape=[dim_size(ctx, x, axis) for axis in others] + [int_or_slot(rows * cols)])
    flat = ((steps + row) * cols + steps + col).to(torch.int32)
    ctx.bind(node, ctx.emit(Take, x=plane, indices=ctx.add_constant(flat), axis=len(others)))


def _nearest_sources(args) -> list:
    """Per spatial axis, the input row each output row copies, as PyTorch's kernel picks
    it: the kernel itself is run at export, one axis at a time (it indexes each axis by
    that axis's sizes and scale alone), on the positions along that axis, so every factor
    — up, down, fractional, by size or by scale — indexes as eager does."""
    sources = []
    for axis, size in enumerate(shape_of(args.input)[2:]):
        shape = [1, 1, 1, 1]
        shape[2 + axis] = size
        positions = torch.arange(size, dtype=torch.float64).reshape(shape)
        output_size = None if args.output_size is None else [n if a == axis else 1 for a, n in enumerate(args.output_size)]
        scales = None if args.scale_factors is None else [f if a == axis else 1.0 for a, f in enumerate(args.scale_factors)]
        picked = torch.ops.aten.upsample_nearest2d.vec(positions, output_size, scales)
        sources.append(picked.flatten().long())
    return sources


def _check_nearest(node, args):
    return None if is_static(shape_of(args.input)[2:]) else "nearest resizing of a dynamic spatial size"


@lowers("aten::upsample_nearest2d.vec", check=_check_nearest)
def _lower_nearest(ctx, node, args):
    """Per spatial axis: nothing where it keeps its size, a broadcast where every row is
    repeated s times ((.., n, ..) -> (.., n, 1, ..) -> (.., n, s, ..) -> merged), else a
    gather of the rows PyTorch picks."""
    out = ctx.tensor(args.input)
    leading = [dim_size(ctx, args.input, 0), dim_size(ctx, args.input, 1)]
    spatial = list(shape_of(args.input)[2:])
    for axis, sources in enumerate(_nearest_sources(args)):
        size, picked = spatial[axis], len(sources)
        if picked == size and torch.equal(sources, torch.arange(size)):
            continue
        if picked % size == 0 and torch.equal(sources, torch.arange(picked) // (picked // size)):
            split = spatial[:axis] + [size, 1] + spatial[axis + 1 :]
            out = ctx.emit(Reshape, x=out, shape=leading + [int_or_slot(v) for v in split])
            split[axis + 1] = picked // size
            out = ctx.emit(BroadcastTo, x=out, shape=leading + [int_or_slot(v) for v in split])
            spatial[axis] = picked
            out = ctx.emit(Reshape, x=out, shape=leading + [int_or_slot(v) for v in spatial])
        else:
            out = ctx.emit(Take, x=out, indices=ctx.add_constant(sources.to(torch.int32)), axis=axis + 2)
            spatial[axis] = picked
    ctx.bind(node, out)


def _check_bilinear(node, args):
    if not dtype_of(args.input).is_floating_point:
        return f"bilinear upsampling of {dtype_name(dtype_of(args.input))} (PyTorch interpolates it in fixed point)"
    return None if is_static(shape_of(args.input)) else "bilinear upsampling of a dynamic shape"


def _source_index(in_size: int, out_size: int, align_corners: bool, scale):
    """PyTorch's area_pixel_compute_source_index, per output position: (i0, i1, w1)."""
    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        src = torch.arange(out_size, dtype=torch.float64) * ratio
    else:
        ratio = 1.0 / scale if scale else in_size / out_size
        src = ((torch.arange(out_size, dtype=torch.float64) + 0.5) * ratio - 0.5).clamp(min=0)
    i0 = src.floor().long().clamp(max=in_size - 1)
    i1 = (i0 + 1).clamp(max=in_size - 1)
    return i0, i1, (src - i0).to(torch.float32)


@lowers("aten::upsample_bilinear2d.vec", check=_check_bilinear)
def _lower_bilinear(ctx, node, args):
    """Separable linear interpolation: per spatial axis, two gathers with indices and
    weights computed at export, blended in float32."""
    x, output_size, align_corners, scale_factors = args.input, args.output_size, args.align_corners, args.scale_factors
    dtype = out_dtype(node)
    spatial = shape_of(x)[2:]
    if output_size is None:
        output_size = [int(n * s) for n, s in zip(spatial, scale_factors)]
    out = as_dtype(ctx, x, torch.float32)
    for axis, (n, m) in enumerate(zip(spatial, output_size), start=2):
        scale = scale_factors[axis - 2] if scale_factors else None
        i0, i1, w1 = _source_index(n, m, bool(align_corners), scale)
        weight_shape = (m,) + (1,) * (rank_of(x) - 1 - axis)
        low = ctx.emit(Take, x=out, indices=ctx.add_constant(i0.to(torch.int32)), axis=axis)
        high = ctx.emit(Take, x=out, indices=ctx.add_constant(i1.to(torch.int32)), axis=axis)
        delta = ctx.emit(Binary, op=BinaryOp.Sub, a=high, b=low)
        step = ctx.emit(Binary, op=BinaryOp.Mul, a=delta, b=ctx.add_constant(w1.reshape(weight_shape)))
        out = ctx.emit(Binary, op=BinaryOp.Add, a=low, b=step)
    ctx.bind(node, out if dtype == torch.float32 else ctx.emit(AsType, x=out, dtype=ir_dtype(dtype)))


_ANTIALIASED = {
    "aten::_upsample_bilinear2d_aa": torch.ops.aten._upsample_bilinear2d_aa,
    "aten::_upsample_bicubic2d_aa": torch.ops.aten._upsample_bicubic2d_aa,
}


def _check_antialiased(node, args):
    if not dtype_of(args.self).is_floating_point:
        return f"antialiased resizing of {dtype_name(dtype_of(args.self))} (PyTorch resizes it in fixed point)"
    return None if is_static(shape_of(args.self)[2:]) else "antialiased resizing of a dynamic spatial size"


@lowers(*_ANTIALIASED, check=_check_antialiased)
def _lower_antialiased(ctx, node, args):
    """``interpolate(..., antialias=True)``: a fixed filter per axis, one matmul each
    (``separable.py``), its weights PyTorch's."""
    resize = _ANTIALIASED[op_name(node.target)]
    scales = (args.get("scales_h"), args.get("scales_w"))

    def per_axis(x, axis, sizes):
        return resize(x, sizes, args.align_corners, *(scales[a] if a == axis else None for a in range(2)))

    spatial = list(shape_of(args.self)[2:])
    lower_per_axis(ctx, node, args.self, axis_matrices(per_axis, spatial, list(args.output_size)))


def _strided_view(args):
    """``as_strided(x, size, stride, offset)`` over a contiguous ``x`` as MLX views: its
    dims of stride 0 broadcast, dims of size 1 ignored, and the others, by stride, a
    contiguous block of ``x``'s elements starting at ``offset``; ``(block sizes in stride
    order, their permutation into the output, offset)``, or the reason it is not one."""
    x, size, stride = args.self, list(args.size), list(args.stride)
    offset = args.storage_offset or 0
    if not is_static(shape_of(x)) or not is_static(size + stride + [offset]):
        return "as_strided of a dynamic shape"
    if not x.meta["val"].is_contiguous():
        return "as_strided over a tensor not stored contiguously"
    kept = sorted((-s, axis) for axis, (n, s) in enumerate(zip(size, stride)) if n > 1 and s != 0)
    block = [size[axis] for _, axis in kept]
    expected = 1
    for negative, axis in reversed(kept):
        if -negative != expected:
            return f"as_strided with strides {stride} for sizes {size}: not a permutation of a contiguous block"
        expected *= size[axis]
    if 0 in size:
        return "as_strided to an empty tensor"
    if offset < 0 or offset + expected > math.prod(shape_of(x)):
        return f"as_strided reaching past the {math.prod(shape_of(x))} elements of its input"
    return block, [axis for _, axis in kept], offset


def _check_as_strided(node, args):
    view = _strided_view(args)
    return view if isinstance(view, str) else None


@lowers("aten::as_strided_copy", check=_check_as_strided)
def _lower_as_strided(ctx, node, args):
    """The block sliced from ``x`` flattened, shaped in stride order, permuted into the
    output's order, and broadcast along the stride-0 dims (a ConvNeXt's pooled
    ``[N, C, 1, 1]`` restrided channels-last is a reshape)."""
    block, axes, offset = _strided_view(args)
    size, total = list(args.size), math.prod(shape_of(args.self))
    out = ctx.emit(Reshape, x=ctx.tensor(args.self), shape=[int_or_slot(total)])
    if offset or math.prod(block) != total:
        out = ctx.emit(Slice, x=out, axis=0, start=int_or_slot(offset), stop=int_or_slot(offset + math.prod(block)), step=1)
    out = ctx.emit(Reshape, x=out, shape=[int_or_slot(n) for n in block])
    order = sorted(range(len(axes)), key=lambda i: axes[i])
    if order != list(range(len(axes))):
        out = ctx.emit(Transpose, x=out, perm=order)
    kept = set(axes)
    ones = [n if axis in kept else 1 for axis, n in enumerate(size)]
    out = ctx.emit(Reshape, x=out, shape=[int_or_slot(n) for n in ones])
    if ones != size:
        out = ctx.emit(BroadcastTo, x=out, shape=[int_or_slot(n) for n in size])
    ctx.bind(node, out)
