"""Quantized kernels: QuantizedMatmul (a linear layer's weight, or a quantized KV
cache's keys and values), Dequantize (rows gathered from a quantized embedding) and
GatherQmm (quantized experts), in MLX's affine mode or one of its float modes (mxfp4,
mxfp8, nvfp4: no biases); Quantize (keys and values written to a quantized KV cache).
MLX checks that the packed weights, scales and biases agree in shape and dtype; the
parameters are checked here."""

import math

import mlx.core as mx

from etmlx.serializer.constants import QUANTIZED_BITS as BITS
from etmlx.serializer.constants import QUANTIZED_CACHE_BITS as CACHE_BITS
from etmlx.serializer.constants import QUANTIZED_FLOAT_BITS as FLOAT_BITS
from etmlx.serializer.constants import QUANTIZED_FLOAT_GROUP_SIZES as FLOAT_GROUP_SIZES
from etmlx.serializer.constants import QUANTIZED_GROUP_SIZES as GROUP_SIZES
from etmlx.serializer.generated.etmlx_ir.QuantMode import QuantMode
from etmlx.serializer.generated.etmlx_ir.QuantizedPart import QuantizedPart
from etmlx.serializer.ir import QUANT_MODE_NAMES as MODES

from .matmul import clamped_expert_indices, half_on_cpu, product


def _parameters(op) -> dict:
    mode = getattr(op, "mode", QuantMode.Affine)
    if mode != QuantMode.Affine:
        expected = FLOAT_BITS[mode - 1], FLOAT_GROUP_SIZES[mode - 1]
        if (op.bits, op.groupSize) != expected or getattr(op, "hasBiases", False):
            raise ValueError(f"{MODES[mode]} weights of {op.bits} bits in groups of {op.groupSize}"
                             f"{' with biases' if op.hasBiases else ''} ({MODES[mode]} is {expected[0]} bits in "
                             f"groups of {expected[1]}, without biases)")
    elif op.bits not in BITS or op.groupSize not in GROUP_SIZES or not getattr(op, "hasBiases", True):
        raise ValueError(f"quantized weights of {op.bits} bits in groups of {op.groupSize} (etmlx writes bits "
                         f"{', '.join(map(str, BITS))} and groups of {', '.join(map(str, GROUP_SIZES))}, with biases)")
    return dict(group_size=op.groupSize, bits=op.bits, mode=MODES[mode])


def _biases(op, env):
    return env.t(op.biases) if getattr(op, "hasBiases", True) else None


def _words(w):
    """Packed words as MLX's kernels take them: uint32 (a cache holds them as int32)."""
    return mx.view(w, mx.uint32) if w.dtype == mx.int32 else w


# MLX's CPU quantized matmul is a scalar loop per row of x; from this many rows on (a
# prefill chunk, attention over a quantized cache), dequantizing the weights and
# multiplying with BLAS is faster (docs/architecture.md, "MLX traps").
CPU_DEQUANTIZED_ROWS = 4

# The weights are dequantized a block of rows of about this many values at a time: MLX's
# CPU dequantize holds five times its output while it runs, and its scheduler runs a
# dequantize (which reads only constants) long before the product that needs it, so whole
# weights held ~400 MiB at once in a 1B model's prefill. Each block waits for the product
# of the block before it (the first for x): a few blocks are held at a time.
CPU_DEQUANTIZED_BLOCK_VALUES = 2**20
# Blocks are whole multiples of this many rows: at a prefill's sizes OpenBLAS then rounds
# every element of the product as for the whole weight, where blocks of 1 or 33 rows
# moved last bits (its small-matrix kernels, as over a cache's 64-wide heads, still may).
CPU_DEQUANTIZED_BLOCK_ROWS = 64


def _quantized_matmul(op, env):
    parameters = _parameters(op)
    x, w, scales, biases = env.t(op.x), _words(env.t(op.w)), env.t(op.scales), _biases(op, env)
    if mx.default_device() == mx.cpu and x.ndim >= 2 and x.shape[-2] >= CPU_DEQUANTIZED_ROWS:
        if parameters["mode"] == "affine":  # float16 scales of float32 weights (GGUF's): widened first, exactly
            scales, biases = scales.astype(x.dtype), biases.astype(x.dtype)
        if not op.transpose:  # blocks of rows would split the sums
            return product(x, _cpu_dequantize(w, scales, biases, parameters, x.dtype))
        return _dequantized_by_blocks(x, w, scales, biases, parameters)
    if half_on_cpu(x):
        # the kernel in half precision: 7.6x its float32 time (a row of 2048 by 11008: 157 ms
        # against 21), so in float32, rounded back once (a decode step of a bfloat16 export)
        if parameters["mode"] == "affine":
            scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
        wide = mx.quantized_matmul(x.astype(mx.float32), w, scales, biases, transpose=op.transpose, **parameters)
        return wide.astype(x.dtype)
    return mx.quantized_matmul(x, w, scales, biases, transpose=op.transpose, **parameters)


def _cpu_dequantize(w, scales, biases, parameters, dtype):
    """MLX's affine dequantize of 2, 4 or 8 bits, bit for bit, from the words' bytes: its
    CPU form (shifts of the uint32 words, a concatenate, the affine step) makes 20
    arrays and 8x the output's bytes on the way at 4 bits; this one 4 arrays and 3x, in
    half the time. Each byte holds 8 / bits values, the lowest first (MLX packs words
    little-endian, as the byte order of every machine MLX runs on). Other widths, the
    float modes and operands MLX would refuse (it says why): MLX's own."""
    bits, group_size = parameters["bits"], parameters["group_size"]
    if parameters["mode"] != "affine" or bits not in (2, 4, 8) or not _in_mlx_layout(w, scales, biases, parameters):
        return mx.dequantize(w, scales, biases, **parameters, dtype=dtype)
    packed = mx.view(w, mx.uint8)
    if bits < 8:
        mask = (1 << bits) - 1
        packed = mx.stack([(packed >> shift) & mask for shift in range(0, 8, bits)], axis=-1)
    values = packed.reshape(*w.shape[:-1], -1, group_size)
    dense = values * mx.expand_dims(scales, -1) + mx.expand_dims(biases, -1)
    return dense.reshape(*w.shape[:-1], -1).astype(dtype)


def _in_mlx_layout(w, scales, biases, parameters) -> bool:
    """Whether MLX's dequantize would take these operands (a broadcast would not)."""
    return (
        w.dtype == mx.uint32 and w.ndim >= 2 and scales.dtype == biases.dtype
        and mx.issubdtype(scales.dtype, mx.floating) and w.shape[:-1] == scales.shape[:-1] == biases.shape[:-1]
        and w.shape[-1] * 32 == scales.shape[-1] * parameters["group_size"] * parameters["bits"]
    )


def _dequantized_by_blocks(x, w, scales, biases, parameters):
    """``x @ dequantized(w).T`` on the CPU, ``w`` dequantized a block of rows at a time."""
    rows = w.shape[-2]
    values_per_row = max(1, math.prod(w.shape[:-2]) * scales.shape[-1] * parameters["group_size"])
    step = CPU_DEQUANTIZED_BLOCK_VALUES // values_per_row
    step = max(CPU_DEQUANTIZED_BLOCK_ROWS, step - step % CPU_DEQUANTIZED_BLOCK_ROWS)
    if rows <= step:
        return product(x, mx.swapaxes(_cpu_dequantize(w, scales, biases, parameters, x.dtype), -1, -2))
    products = []
    for start in range(0, rows, step):
        block = slice(start, start + step)
        dense = _cpu_dequantize(
            w[..., block, :], scales[..., block, :], None if biases is None else biases[..., block, :], parameters,
            x.dtype,
        )
        dense = mx.depends([dense], [products[-1] if products else x])[0]
        products.append(product(x, mx.swapaxes(dense, -1, -2)))
    return mx.concatenate(products, axis=-1)


def _quantize(op, env):
    if op.bits not in CACHE_BITS or op.groupSize not in GROUP_SIZES:
        raise ValueError(f"a KV cache quantized to {op.bits} bits in groups of {op.groupSize} (etmlx writes bits "
                         f"{', '.join(map(str, CACHE_BITS))} and groups of {', '.join(map(str, GROUP_SIZES))})")
    if op.part not in (QuantizedPart.Words, QuantizedPart.Scales, QuantizedPart.Biases):
        raise ValueError(f"quantized part {op.part} (etmlx writes 0 to 2)")
    parts = mx.quantize(env.t(op.x), group_size=op.groupSize, bits=op.bits)
    return mx.view(parts[0], mx.int32) if op.part == QuantizedPart.Words else parts[op.part]


def _dequantize(op, env):
    parameters = _parameters(op)
    exact = {} if parameters["mode"] == "affine" else {"dtype": mx.float32}  # MLX's default: bfloat16
    return mx.dequantize(env.t(op.w), env.t(op.scales), _biases(op, env), **parameters, **exact)


def _gather_qmm(op, env):
    w = env.t(op.w)
    if w.ndim != 3:
        raise ValueError(f"gather_qmm over packed weights of shape {tuple(w.shape)}: expected (experts, N, K packed)")
    indices = clamped_expert_indices(env.t(op.rhsIndices), w.shape[0], "gather_qmm")
    return mx.gather_qmm(
        env.t(op.x), w, env.t(op.scales), env.t(op.biases), rhs_indices=indices, transpose=op.transpose,
        **_parameters(op),
    )


HANDLERS = {
    "QuantizedMatmul": _quantized_matmul, "Dequantize": _dequantize, "GatherQmm": _gather_qmm, "Quantize": _quantize,
}
