"""ExecuTorch's exportable quantized tensors (``executorch.extension.llm.export``) on
MLX's quantized kernels. Each dequantizes through a ``torchao::`` op of its own, whose
operands are the weight's constants; here they are repacked once, at export, into the
fields of MLX's ``QuantizedMatmul`` and ``Dequantize`` (``packed``), and the op alone (a
weight read other than by a layer) is the whole weight dequantized. Linear and
embedding layers of them are fused (``fusions/exportable_tensors.py``).

- ``ExportableInt4Tensor``: nibble-packed (N, K/2) uint8 values in [0, 15] (an even
  column in the low nibble: MLX's own packing), scale and zero point (K/g, N), as
  ``scale * (q - zero_point)``: MLX's affine mode.
- ``ExportableMXTensor`` (mxfp8): FP8 E4M3 values (N, K), one value a byte, and a
  float8_e8m0fnu power of two per 32: MLX's mxfp8, its bytes four to a uint32 word.
- ``ExportableNVFP4Tensor``: FP4 E2M1 values packed eight to a uint32 (N, K/8) and an
  FP8 E4M3 scale per 16 (uint8): MLX's nvfp4; its per-tensor float32 scale multiplies
  the result (``x @ (s W)^T = s (x @ W^T)``: MLX's matmul takes none).
- etmlx's own ``Mxfp4Tensor`` (``etmlx/quant/mxfp4.py``): FP4 E2M1 values two a byte (N, K/2)
  and an E8M0 power of two per 32: MLX's mxfp4, its bytes four to a uint32 word.
"""

from typing import NamedTuple, Optional

import torch

from etmlx.serializer.generated.etmlx_ir import AsType, Binary, Dequantize
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.QuantMode import QuantMode

from ..arguments import bind
from ..dtypes import FLOATING, ir_dtype
from ..registry import lowers, op_name
from .common import example_of
from .quantized import _groups_reason, _mlx_group_size, check_fixed_at_export, mlx_layout, nibbles

INT4_TENSOR = "torchao::dequantize_int4_tensor"
MX_TENSOR = "torchao::dequantize_mx"
NVFP4_TENSOR = "torchao::dequantize_nvfp4"
MXFP4_TENSOR = "etmlx::dequantize_mxfp4"  # etmlx's own (etmlx/quant/mxfp4.py): ExecuTorch's MX takes FP8 only


class Packed(NamedTuple):
    """A weight in MLX's layout: ``fields`` of its quantized nodes, and the slot of a
    per-tensor scale to multiply their result by (or None)."""

    fields: dict
    scale_after: Optional[object] = None


def _check_int4_tensor(node, args) -> Optional[str]:
    reason = check_fixed_at_export((args.qdata, args.scale, args.zero_point))
    if reason:
        return reason
    qdata, scale, zero_point = (example_of(a) for a in (args.qdata, args.scale, args.zero_point))
    if qdata.dtype != torch.uint8 or qdata.dim() != 2:
        return f"a {qdata.dim()}-d {qdata.dtype} int4 tensor (ExportableInt4Tensor packs (N, K/2) uint8)"
    rows, columns = qdata.shape[0], 2 * qdata.shape[1]
    if _groups_reason(columns, args.group_size):
        return _groups_reason(columns, args.group_size)
    groups = (columns // args.group_size, rows)
    if tuple(scale.shape) != groups or tuple(zero_point.shape) != groups:
        return f"scales {tuple(scale.shape)} and zero points {tuple(zero_point.shape)} for groups {groups}"
    return _output_reason(args)


def _int4_tensor(ctx, args) -> Packed:
    """Its values signed as torchao's (q - 8), the zero point shifted alike."""
    qdata, scale, zero_point = (ctx.constant_values[a] for a in (args.qdata, args.scale, args.zero_point))
    values = nibbles(qdata) - 8
    scale, zero_point = scale.t().to(torch.float64), zero_point.t().to(torch.float64) - 8
    packed, scales, biases = mlx_layout(values, scale, zero_point, args.group_size, 4, args.output_dtype)
    return Packed(dict(w=ctx.add_constant(packed), scales=ctx.add_constant(scales), biases=ctx.add_constant(biases),
                       groupSize=_mlx_group_size(args.group_size), bits=4))


def _check_mx_tensor(node, args) -> Optional[str]:
    reason = check_fixed_at_export((args.qdata, args.scale))
    if reason:
        return reason
    qdata, scale = example_of(args.qdata), example_of(args.scale)
    if args.elem_dtype != torch.float8_e4m3fn or qdata.dtype != torch.float8_e4m3fn or qdata.dim() != 2:
        return f"MX elements of {args.elem_dtype} (MLX's mxfp8 takes 2-d float8_e4m3fn values)"
    if args.block_size != 32 or qdata.shape[1] % 32 or tuple(scale.shape) != (qdata.shape[0], qdata.shape[1] // 32):
        return f"MX blocks of {args.block_size} with scales {tuple(scale.shape)} (MLX's mxfp8: one per 32 values)"
    return _output_reason(args)


def _mx_tensor(ctx, args) -> Packed:
    qdata, scale = ctx.constant_values[args.qdata], ctx.constant_values[args.scale]
    words = qdata.contiguous().view(torch.uint8).view(torch.int32).view(torch.uint32)  # little-endian: MLX's order
    return Packed(dict(w=ctx.add_constant(words), scales=ctx.add_constant(scale.contiguous().view(torch.uint8)),
                       groupSize=32, bits=8, mode=QuantMode.Mxfp8, hasBiases=False))


def _check_mxfp4_tensor(node, args) -> Optional[str]:
    reason = check_fixed_at_export((args.qdata, args.scale))
    if reason:
        return reason
    qdata, scale = example_of(args.qdata), example_of(args.scale)
    if qdata.dtype != torch.uint8 or qdata.dim() != 2 or qdata.shape[1] % 16:
        return f"mxfp4 values of {qdata.dtype}, shape {tuple(qdata.shape)} (two a byte, 32 values a scale)"
    if scale.dtype != torch.float8_e8m0fnu or tuple(scale.shape) != (qdata.shape[0], qdata.shape[1] // 16):
        return f"mxfp4 scales of {scale.dtype}, shape {tuple(scale.shape)} (one float8_e8m0fnu per 32 values)"
    return _output_reason(args)


def _mxfp4_tensor(ctx, args) -> Packed:
    qdata, scale = ctx.constant_values[args.qdata], ctx.constant_values[args.scale]
    words = qdata.contiguous().view(torch.int32).view(torch.uint32)  # eight FP4 codes a word, MLX's order
    return Packed(dict(w=ctx.add_constant(words), scales=ctx.add_constant(scale.contiguous().view(torch.uint8)),
                       groupSize=32, bits=4, mode=QuantMode.Mxfp4, hasBiases=False))


def _check_nvfp4_tensor(node, args) -> Optional[str]:
    reason = check_fixed_at_export((args.qdata, args.scale, args.per_tensor_scale))
    if reason:
        return reason
    qdata, scale = example_of(args.qdata), example_of(args.scale)
    if qdata.dtype != torch.uint32 or scale.dtype != torch.uint8 or qdata.dim() != 2:
        return f"NVFP4 values of {qdata.dtype}, scales of {scale.dtype} (MLX's nvfp4: uint32 words, uint8 scales)"
    if args.block_size != 16 or tuple(scale.shape) != (qdata.shape[0], qdata.shape[1] // 2):
        return f"NVFP4 blocks of {args.block_size} with scales {tuple(scale.shape)} (MLX's nvfp4: one per 16 values)"
    if example_of(args.per_tensor_scale).numel() != 1:
        return "a per-tensor scale of more than one value"
    return _output_reason(args)


def _nvfp4_tensor(ctx, args) -> Packed:
    fields = dict(w=ctx.add_constant(ctx.constant_values[args.qdata].contiguous()),
                  scales=ctx.add_constant(ctx.constant_values[args.scale].contiguous()),
                  groupSize=16, bits=4, mode=QuantMode.Nvfp4, hasBiases=False)
    scale = ctx.constant_values[args.per_tensor_scale].reshape(())
    return Packed(fields, ctx.add_constant(scale.to(args.output_dtype)))


def _output_reason(args) -> Optional[str]:
    return None if args.output_dtype in FLOATING else f"dequantized to {args.output_dtype}"


# op -> (check(node, args) -> reason or None, repack(ctx, args) -> Packed)
EXPORTABLES = {
    INT4_TENSOR: (_check_int4_tensor, _int4_tensor),
    MX_TENSOR: (_check_mx_tensor, _mx_tensor),
    NVFP4_TENSOR: (_check_nvfp4_tensor, _nvfp4_tensor),
    MXFP4_TENSOR: (_check_mxfp4_tensor, _mxfp4_tensor),
}


def packed(ctx, node) -> Packed:
    """The weight the exportable's dequantize ``node`` reads, in MLX's layout: once per weight."""
    repack = EXPORTABLES[op_name(node.target)][1]
    return ctx.once(("exportable", node), lambda: repack(ctx, bind(node)))


def scaled(ctx, out, weight: Packed):
    """``out`` multiplied by the weight's per-tensor scale, where it has one."""
    if weight.scale_after is None:
        return out
    return ctx.emit(Binary, op=BinaryOp.Mul, a=out, b=weight.scale_after)


def dequantized(ctx, weight: Packed, rows: dict, dtype: torch.dtype):
    """``Dequantize`` of ``rows`` (the weight's w, scales and biases, or rows of them) in
    ``dtype``, as the exportable's op computes it: a float mode's float32 values scaled,
    then converted."""
    fields = {**weight.fields, **rows}
    out = scaled(ctx, ctx.emit(Dequantize, **fields), weight)
    if fields.get("mode", QuantMode.Affine) != QuantMode.Affine and dtype != torch.float32:
        out = ctx.emit(AsType, x=out, dtype=ir_dtype(dtype))
    return out


def _lower(ctx, node, args):
    """The whole weight dequantized (constants only: evaluated once, at load); a linear or
    embedding layer of it runs on the packed weight instead."""
    weight = packed(ctx, node)
    rows = {name: weight.fields[name] for name in ("w", "scales", "biases") if name in weight.fields}
    ctx.bind(node, dequantized(ctx, weight, rows, args.output_dtype))


for _op, (_check, _) in EXPORTABLES.items():
    lowers(_op, check=_check, repacks_constants=True)(_lower)
