"""Weight-only quantized linear and embedding layers on MLX's quantized kernels.

torchao's weight-only configs store a weight as signed integers ``q`` of ``bits`` bits
(in int8), with a scale ``s`` and zero point ``z`` per group of ``group_size`` values
along each row, and dequantize it before the layer: ``w = (q - z) * s``. The
partitioner retargets ``linear``/``embedding`` of such a weight to
``etmlx::quantized_linear``/``etmlx::quantized_embedding`` (``check_quantized_weight``
decides, before decomposition); here the weight is repacked once, at export, into MLX's
affine layout, ``w = s * Q + B`` with ``Q = q + 2^(bits-1)`` unsigned, packed into uint32
(a little-endian bit stream), and ``B = -s * (z + 2^(bits-1))``.

A zero point may be fractional (a GGUF file's minimum over its scale, ``gguf_model``):
``B`` is computed in float64 all the same. A weight MLX cannot take as it is (7 bits, a
group of 16) is declined: its ``dequantize_affine`` is evaluated at export (``_lower_dequantize``) and
the layer runs on the float weight, computing what torchao computes.
"""

import sys
from functools import partial
from typing import Optional

import torch

from etmlx.serializer.constants import QUANTIZED_BITS, QUANTIZED_GROUP_SIZES
from etmlx.serializer.generated.etmlx_ir import Binary, Dequantize, QuantizedMatmul, Take
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp

from .. import deferred
from ..context import Stored, stored
from ..dtypes import FLOATING
from ..folding import evaluate_at_export
from ..registry import is_frozen_placeholder, lowers
from .common import dtype_of, example_of
from .indexing import checked_index

BITS = QUANTIZED_BITS
MLX_GROUP_SIZES = tuple(sorted(QUANTIZED_GROUP_SIZES, reverse=True))  # a larger group is these sharing one scale


def bits_of(quant_min, quant_max) -> Optional[int]:
    """The width of a signed range ``[-2^(b-1), 2^(b-1) - 1]``, else None."""
    for bits in range(1, 9):
        if (quant_min, quant_max) == (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1):
            return bits
    return None


def check_quantized_weight(qdata, scale, zero_point, block_size, bits, dtype) -> Optional[str]:
    """None when MLX's kernels compute this weight's layer exactly as torchao's
    dequantize-then-layer does; otherwise why not. Takes example values (fake tensors)
    and the layer's activation ``dtype``."""
    if qdata.dim() not in (2, 3) or qdata.dtype != torch.int8:
        return f"a {qdata.dim()}-d {qdata.dtype} quantized weight (etmlx takes 2-d or 3-d int8 storage)"
    if bits not in BITS:
        return f"{bits}-bit weights (MLX's kernels here take {', '.join(map(str, BITS))} bits)"
    *rows, columns = qdata.shape
    if len(block_size) != qdata.dim() or any(size != 1 for size in block_size[:-1]):
        return f"block size {list(block_size)} (MLX groups values along each row)"
    group_size = block_size[-1]
    if not isinstance(columns, int):
        return f"rows of a dynamic size ({columns} values; MLX's groups are fixed at export)"
    if _groups_reason(columns, group_size):
        return _groups_reason(columns, group_size)
    if scale.dtype not in FLOATING or scale.dtype != dtype:
        return f"{scale.dtype} scales with {dtype} activations (MLX dequantizes in the activations' dtype)"
    groups = (*rows, columns // group_size)
    if tuple(scale.shape) != groups:
        return f"scales of shape {tuple(scale.shape)} for groups {groups}"
    if zero_point is not None and tuple(zero_point.shape) != groups:
        return f"zero points of shape {tuple(zero_point.shape)} for groups {groups}"
    return None


def _groups_reason(columns: int, group_size: int) -> Optional[str]:
    """Why rows of ``columns`` values cannot be MLX's groups of ``group_size``, or None."""
    if columns % group_size or _mlx_group_size(group_size) is None:
        return f"groups of {group_size} (MLX takes groups of 32, 64 or 128, or multiples of 32 sharing a scale)"
    return None


def _mlx_group_size(group_size: int) -> Optional[int]:
    return next((g for g in MLX_GROUP_SIZES if group_size % g == 0), None)


def mlx_layout(qdata, scale, zero_point, group_size: int, bits: int, dtype, narrow: bool = False):
    """(packed uint32 weights, scales, biases) in MLX's affine layout, for torchao's
    ``(qdata, scale, zero_point)`` quantized per ``group_size`` values of each row (of
    a matrix, or of each matrix of a stack). ``narrow``: float32 scales and biases that
    float16 holds exactly (a GGUF file's) are stored as float16, which MLX's matmul
    widens exactly."""
    return (packed_words(qdata, bits),
            *mlx_scales(scale, zero_point, group_size, bits, dtype, narrow))


def mlx_scales(scale, zero_point, group_size: int, bits: int, dtype, narrow: bool = False):
    """The (scales, biases) half of ``mlx_layout``."""
    mlx_group = _mlx_group_size(group_size)
    offset = 2 ** (bits - 1)
    repeat = group_size // mlx_group
    scales = scale.repeat_interleave(repeat, dim=-1).to(dtype).contiguous()
    narrowed = narrow and dtype == torch.float32
    if not narrowed and scale.dtype == dtype and (zero_point is None or not zero_point.any()):
        # a symmetric quantization's: -offset * scale, a power of two times it, exact in its dtype
        return scales, (scales * -offset).contiguous()
    zero = torch.zeros_like(scale, dtype=torch.float64) if zero_point is None else zero_point.to(torch.float64)
    biases = -scale.to(torch.float64) * (zero + offset)
    # what the zero point's own float32 rounding leaves uncertain in each bias: 2 ulps of it
    uncertain = scale.to(torch.float64).abs() * (zero.abs() + offset) * 2.0**-23
    if narrowed and _held_by_half(scales, 0) and _held_by_half(biases, uncertain):
        return scales.half(), biases.repeat_interleave(repeat, dim=-1).half().contiguous()
    return scales, biases.repeat_interleave(repeat, dim=-1).to(dtype).contiguous()


def _held_by_half(values, tolerance) -> bool:
    """Whether float16 holds ``values`` to within ``tolerance`` (each): a GGUF file's
    biases are its float16 minimums, come back through a float32 zero point; values that
    merely happen to lie that near float16 ones are as rare as that tolerance is small
    against float16's spacing (2^-11 of a value)."""
    half = values.half().to(values.dtype)
    return bool(torch.isfinite(half).all() and ((half - values).abs() <= tolerance).all())


def nibbles(packed):
    """Two 4-bit values a byte, the even one in the low nibble (ExecuTorch's int4 tensors,
    its MLX delegate's 4-bit stacks), unpacked along the last axis, as int64."""
    return torch.stack([packed & 15, packed >> 4], -1).flatten(-2).to(torch.int64)


def _bitstream(values, bits: int, offset: int = 0):
    """Each row's ``values + offset`` (unsigned) as MLX packs them, a little-endian stream
    of ``bits`` bits a value in uint32 words (value i at bits ``i * bits``; at 3, 5 and 6
    bits some straddle two words). Rows go in blocks, so a weight is widened a block at a
    time."""
    *rows, columns = values.shape
    flat = values.reshape(-1, columns)
    words = torch.empty(flat.shape[0], columns * bits // 32, dtype=torch.int32)
    step = max(1, 2**22 // max(columns, 1))
    pack = _bytes_of_values if 8 % bits == 0 else _words_of_values
    for start in range(0, flat.shape[0], step):
        # the offset added modulo 256, which holds every sum: one temporary of the block's size (int16 took two of twice it)
        words[start:start + step] = pack(flat[start:start + step].to(torch.uint8, copy=True).add_(offset), bits)
    return words.reshape(*rows, -1).view(torch.uint32)


def packed_form(bits: int) -> tuple:
    """What names ``packed_integers``'s result among a constant's forms (``deferred.offer``)."""
    return ("mlx packed", bits)


def packed_integers(qdata, bits: int) -> Stored:
    """``packed_weight``'s words of the integers ``qdata``, as the program stores them."""
    return stored(packed_words(qdata, bits))


def packed_words(qdata, bits: int):
    """MLX's uint32 words of the signed ``bits``-bit integers ``qdata``, row by row: a block
    of rows packs to the same rows of a whole matrix's words."""
    return _bitstream(qdata, bits, 2 ** (bits - 1))


def _bytes_of_values(unsigned, bits: int):
    """``_bitstream``'s words where a value never straddles a byte (2, 4 and 8 bits): the
    values of each byte or-ed at their shifts, four bytes a little-endian word."""
    values = unsigned.to(torch.uint8)
    per_byte = 8 // bits
    packed = values[:, 0::per_byte].clone()
    for j in range(1, per_byte):
        packed |= values[:, j::per_byte] << (j * bits)
    return packed.view(torch.int32) if sys.byteorder == "little" else _little_endian_words(packed)


def _little_endian_words(packed):
    quads = packed.to(torch.int64).reshape(packed.shape[0], -1, 4)
    words = quads[..., 0] | quads[..., 1] << 8 | quads[..., 2] << 16 | quads[..., 3] << 24
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _words_of_values(unsigned, bits: int):
    """``_bitstream``'s words in general: each value's bits added at its offset in the
    stream, the high part of a straddling value in the next word."""
    columns = unsigned.shape[-1]
    unsigned = unsigned.to(torch.int64)
    start = torch.arange(columns, dtype=torch.int64) * bits
    word, shift = start // 32, start % 32
    shifted = unsigned << shift
    words = torch.zeros(unsigned.shape[0], columns * bits // 32 + 1, dtype=torch.int64)
    words.index_add_(-1, word, shifted & 0xFFFFFFFF)
    words.index_add_(-1, word + 1, shifted >> 32)  # the straddling high bits; zero elsewhere
    words = words[..., :-1]
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def check_fixed_at_export(parts, is_fixed=is_frozen_placeholder) -> Optional[str]:
    """Why a quantized weight's ``(qdata, scale, zero_point)`` cannot be repacked at
    export (one computed at run time), or None. ``zero_point`` may be absent."""
    if not all(is_fixed(part) for part in parts if part is not None):
        return "quantized weights computed at run time (etmlx repacks them at export)"
    return None


def _check_layer(args, dtype, dims: int = 2) -> Optional[str]:
    return check_fixed_at_export((args.qdata, args.scale, args.zero_point)) or check_quantized_weight(
        example_of(args.qdata), example_of(args.scale), example_of(args.zero_point),
        [1] * (dims - 1) + [args.group_size], args.bits, dtype,
    )


def packed_weight(ctx, args, dtype, narrow: bool = False):
    """The constants (slots) of a quantized weight repacked for MLX, and the group size
    and bits its kernels take, as the fields of a quantized node (``narrow``: of
    ``mlx_layout``). A weight two layers share (a head tied to the embedding) has its
    values packed once: the largest matrix of a small model, read and packed again
    at the end of lowering, set the export's peak."""
    def packed_values():
        qdata, form = ctx.constant_values.unresolved(args.qdata), packed_form(args.bits)
        return ctx.add_constant(deferred.prepared(qdata, form, partial(packed_integers, bits=args.bits)))

    values = [ctx.constant_values[a] if a is not None else None for a in (args.scale, args.zero_point)]
    scales, biases = mlx_scales(*values, args.group_size, args.bits, dtype, narrow)
    return dict(
        w=ctx.once(("packed values", args.qdata, args.bits), packed_values),
        scales=ctx.add_constant(scales), biases=ctx.add_constant(biases),
        groupSize=_mlx_group_size(args.group_size), bits=args.bits,
    )


def _check_linear(node, args):
    return _check_layer(args, dtype_of(args.x))


@lowers("etmlx::quantized_linear", check=_check_linear)
def _lower_linear(ctx, node, args):
    out = ctx.emit(QuantizedMatmul, x=ctx.tensor(args.x), **packed_weight(ctx, args, dtype_of(args.x), narrow=True))
    if args.bias is not None:
        out = ctx.emit(Binary, op=BinaryOp.Add, a=out, b=ctx.tensor(args.bias))
    ctx.bind(node, out)


def _check_embedding(node, args):
    return _check_layer(args, dtype_of(args.scale))


@lowers("etmlx::quantized_embedding", check=_check_embedding)
def _lower_embedding(ctx, node, args):
    """The rows of the packed table, its scales and its biases gathered by id, then
    dequantized: only the rows looked up are ever dequantized."""
    packed = packed_weight(ctx, args, dtype_of(args.scale))
    ids = checked_index(ctx, args.indices, args.qdata, 0, wraps=False)  # PyTorch rejects negative ids
    rows = {name: ctx.emit(Take, x=packed[name], indices=ids, axis=0) for name in ("w", "scales", "biases")}
    ctx.bind(node, ctx.emit(Dequantize, **rows, groupSize=packed["groupSize"], bits=packed["bits"]))


def _check_stack_take(node, args):
    return _check_layer(args, dtype_of(args.scale), 3)


def packed_stack(ctx, args):
    """``packed_weight`` of an ``etmlx::quantized_stack_take``'s stack, once per stack."""
    return ctx.once(("packed stack", args.qdata), lambda: packed_weight(ctx, args, dtype_of(args.scale)))


@lowers("etmlx::quantized_stack_take", check=_check_stack_take)
def _lower_stack_take(ctx, node, args):
    """Matrices of a quantized stack picked by index, then dequantized, as an embedding's
    rows are; multiplied right away they become one ``GatherQmm`` instead
    (``lowering/fusions/gather_mm.py``)."""
    packed = packed_stack(ctx, args)
    ids = checked_index(ctx, args.indices, args.qdata, 0, wraps=True)  # x[ids]: negative ids count from the end
    rows = {name: ctx.emit(Take, x=packed[name], indices=ids, axis=0) for name in ("w", "scales", "biases")}
    ctx.bind(node, ctx.emit(Dequantize, **rows, groupSize=packed["groupSize"], bits=packed["bits"]))


def _check_dequantize(node, args):
    return check_fixed_at_export((args.input, args.scale, args.zero_point))


@lowers("torchao::dequantize_affine", check=_check_dequantize)
def _lower_dequantize(ctx, node, args):
    """A quantized weight MLX's kernels decline, dequantized at export by torchao itself:
    the float weight is what the eager model computes before its layer."""
    evaluate_at_export(ctx, node)
