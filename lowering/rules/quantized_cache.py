"""A quantized KV cache (``etmlx/llm/quantized_cache.py``) on MLX's own kernels: the keys and
values a call writes are quantized by ``mx.quantize`` (``Quantize``, one node per result
used), and attention reads the cache through ``mx.quantized_matmul`` (scores against
the keys transposed, then the weighted sum of the values), never dequantizing it whole
in the graph (on the CPU the runtimes' handler dequantizes first for 4 queries or more,
where MLX's CPU kernel is slow: ``runtime_shim/mlx_ops/quantized.py``).
"""

from typing import Optional

import torch

from etmlx.serializer.constants import QUANTIZED_CACHE_BITS, QUANTIZED_GROUP_SIZES
from etmlx.serializer.generated.etmlx_ir import Quantize, QuantizedMatmul

from ..dtypes import FLOATING
from ..registry import lowers
from .common import example_of, used_outputs


def check_cache_quantization(group_size, bits) -> Optional[str]:
    """Why MLX cannot quantize a cache ``bits`` wide in groups of ``group_size``, or None."""
    if bits not in QUANTIZED_CACHE_BITS:
        return f"a KV cache of {bits}-bit values (etmlx quantizes it to {' or '.join(map(str, QUANTIZED_CACHE_BITS))} bits)"
    if group_size not in QUANTIZED_GROUP_SIZES:
        return f"a KV cache in groups of {group_size} (MLX takes groups of {', '.join(map(str, QUANTIZED_GROUP_SIZES))})"
    return None


def _check_quantize(node, args):
    x = example_of(args.x)
    if x.dtype not in FLOATING:
        return f"quantizing {x.dtype} values"
    if not isinstance(x.shape[-1], int) or x.shape[-1] % args.group_size:
        return f"rows of {x.shape[-1]} values in groups of {args.group_size}"
    return check_cache_quantization(args.group_size, args.bits)


@lowers("etmlx::quantize", check=_check_quantize)
def _lower_quantize(ctx, node, args):
    for part in sorted(used_outputs(node)):
        out = ctx.emit(Quantize, x=ctx.tensor(args.x), groupSize=args.group_size, bits=args.bits, part=part)
        ctx.bind(node, out, index=part)


def _check_matmul(node, args):
    x, words = example_of(args.x), example_of(args.words)
    if words.dtype != torch.int32 or x.dtype not in FLOATING:
        return f"{x.dtype} values times {words.dtype} packed words (etmlx packs them as int32)"
    return check_cache_quantization(args.group_size, args.bits)


@lowers("etmlx::quantized_matmul", check=_check_matmul)
def _lower_matmul(ctx, node, args):
    operands = {name: ctx.tensor(getattr(args, name)) for name in ("x", "scales", "biases")}
    ctx.bind(node, ctx.emit(QuantizedMatmul, w=ctx.tensor(args.words), **operands, groupSize=args.group_size,
                            bits=args.bits, transpose=bool(args.transpose)))
