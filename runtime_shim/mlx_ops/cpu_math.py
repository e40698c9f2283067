"""Functions MLX's CPU backend computes slowly, as products and sums that
``mx.compile`` fuses into one loop. ``mx.erf`` over a ViT-B MLP's activations
(197 x 3072) takes ~20 ms on MLX's CPU, this form ~3 ms (torch: 0.5 ms); ``mx.sigmoid``
over EfficientNet's largest SiLU (112 x 112 x 96) ~19 ms, this form ~2 ms; on a GPU the
runtimes call MLX's own. The native backend evaluates the same operations in the same
order (native/src/mlx_ops/cpu_math.cpp), so both runtimes agree to the bit.

MLX compiles a fused CPU kernel as a plain C++ loop (SSE2 on x86-64), so what vectorizes
decides the speed: products, sums, quotients, ``maximum``, integer shifts and casts do;
``where`` does not (over a condition that varies, ~30x a product's time: mispredicted
branches), nor ``floor`` (~8x). A kernel is at most 11 operations deep; a constant met
past that arrives as a broadcast operand, and the loop stops vectorizing."""

import math

import mlx.core as mx
import mlx.nn as nn

from etmlx.serializer.constants import (
    ERF_CLAMP, ERF_DENOMINATOR, ERF_NUMERATOR, EXP_HIGH, EXP_LOW, GATED_DELTA_CHUNK, GATED_DELTA_LEAST_LOG, LN2_HIGH,
    LN2_LOW, ROUND_TO_INTEGER, EXP_NONPOSITIVE_LEAST, EXP_NONPOSITIVE_LIFT,
)
from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp


NARROW_FLOATS = (mx.float32, mx.float16, mx.bfloat16)  # float64 and integers keep MLX's own


def _polynomial(coefficients: tuple, x: mx.array) -> mx.array:
    """Horner's rule, coefficients from the lowest power up."""
    total = mx.array(coefficients[-1], dtype=x.dtype)
    for c in coefficients[-2::-1]:
        total = total * x + c
    return total


def estrin(coefficients: tuple, x):
    """Estrin's scheme, coefficients from the lowest power up (two or more): pairs c + c' x,
    then pairs of those with x^2, x^4, ...; 2 log2(n) operations deep where Horner's rule
    is 2n, so that a polynomial fits in one fused kernel. Any array type: numpy float32
    in serializer/fit_erf.py."""
    terms, power = list(coefficients), x
    while True:
        pairs = [low + power * high for low, high in zip(terms[::2], terms[1::2])]
        terms = pairs + terms[2 * len(pairs):]
        if len(terms) == 1:
            return terms[0]
        power = power * power


def _kernel_end(x: mx.array) -> mx.array:
    """``x`` through a bitcast and back: the same bits, as the root of its own fused kernel."""
    return mx.view(mx.view(x, mx.uint32), mx.float32)


def rational_erf(x: mx.array) -> mx.array:
    """erf as the rational function of ``serializer/fit_erf.py``, in float32 (at most
    6 ulps from exact; half precision is widened, then rounded once)."""
    clamped = mx.clip(x.astype(mx.float32), -ERF_CLAMP, ERF_CLAMP)
    square = clamped * clamped
    ratio = _kernel_end(estrin(ERF_NUMERATOR, square) / estrin(ERF_DENOMINATOR, square))
    return _kernel_end(mx.clip(clamped * ratio, -1.0, 1.0)).astype(x.dtype)


LOG2_E = 1 / math.log(2)
EXP_TAYLOR = tuple(1 / math.factorial(n) for n in range(8))  # e^r to 5e-9 for |r| <= ln(2) / 2


def _times_power_of_two(value: mx.array, k: mx.array) -> mx.array:
    """value * 2^k for integral float32 k in [-126, 128], from exponent bits; in two
    halves, so that neither factor nor the product on the way leaves float32's range."""
    half = mx.floor(k * 0.5)
    return value * _exponent(half) * _exponent(k - half)


def _exponent(k: mx.array) -> mx.array:
    return mx.view(mx.left_shift(k.astype(mx.int32) + 127, 23), mx.float32)


def exp(x: mx.array) -> mx.array:
    """e^x as 2^k * e^r with r = x - k ln 2 and e^r its Taylor polynomial, in float32:
    at most 2 ulps from exact (mx.exp's CPU kernel: 9e-7 relative, and 30x slower).
    Past float32's range: 0 below (where the result would be subnormal), inf above; a
    NaN stays NaN (it never reaches the integer cast, undefined for NaN)."""
    wide = x.astype(mx.float32)
    nan = mx.isnan(wide)
    reduced = mx.where(nan, 0.0, mx.clip(wide, EXP_LOW, EXP_HIGH))
    k = mx.floor(reduced * LOG2_E + 0.5)
    r = reduced - k * LN2_HIGH - k * LN2_LOW
    value = _times_power_of_two(_polynomial(EXP_TAYLOR, r), k)
    value = mx.where(wide < EXP_LOW, 0.0, mx.where(wide > EXP_HIGH, math.inf, value))
    return mx.where(nan, wide, value).astype(x.dtype)


def _exp_of_nonpositive(t: mx.array) -> mx.array:
    """e^t for float32 t <= 0 (or -inf, or NaN, which stays NaN), to 0 from where it
    rounds to 0, subnormal results kept; at most 2 ulps from exact where normal. From
    operations that all vectorize: k rounded to an integer by ROUND_TO_INTEGER rather
    than ``floor``, e^r by Estrin's scheme, and 2^k added to e^r's exponent bits, lifted so
    that the sum stays normal. The bitcasts end the fused kernels where the 11-deep
    limit would otherwise cut them."""
    t = mx.maximum(t, EXP_NONPOSITIVE_LEAST)
    k = (t * LOG2_E + ROUND_TO_INTEGER) - ROUND_TO_INTEGER
    r = (t - k * LN2_HIGH) - k * LN2_LOW
    lift = mx.left_shift((k.astype(mx.int32) + EXP_NONPOSITIVE_LIFT).astype(mx.uint32), 23)  # wraps, as meant
    lifted = mx.view(mx.view(estrin(EXP_TAYLOR, r), mx.uint32) + lift, mx.float32)
    return lifted * 2.0**-EXP_NONPOSITIVE_LIFT + 0 * t  # 0 * t: +-0, or NaN where t is (its integer bits lose it)


def sigmoid(x: mx.array) -> mx.array:
    """1 / (1 + e^-x) as 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = e^-|x| (never
    past 1, so nothing overflows and small results keep their relative accuracy), in
    float32: at most 3 ulps from exact where the result is a normal number. The sign bit
    picks the numerator as 0/1 factors, not ``where`` (see the module's docstring)."""
    wide = x.astype(mx.float32)
    e = _exp_of_nonpositive(-mx.abs(wide))
    negative = (-mx.right_shift(mx.view(wide, mx.int32), 31)).astype(mx.float32)  # 1 where the sign bit is set
    return (((1 - negative) + e * negative) / (1 + e)).astype(x.dtype)


def softmax(x: mx.array, axis: int) -> mx.array:
    """``mx.softmax(x, axis, precise=True)``: e^(x - max) over its sum, in float32, with this
    exp (MLX's CPU kernel: ~7 ms over 12 x 197 x 197 values, this ~2). An empty array is
    MLX's own (there is no maximum to take)."""
    if x.size == 0:
        return mx.softmax(x, axis=axis, precise=True)
    wide = x.astype(mx.float32)
    e = _exp_of_nonpositive(wide - mx.max(wide, axis=axis, keepdims=True))
    return (e / mx.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask) -> mx.array:
    """``mx.fast.scaled_dot_product_attention`` as MLX computes it on the CPU (the fallback
    in its mlx/fast.cpp: the same products, grouped heads, masks and casts) with this
    module's softmax. MLX's own call still checks the operands and raises its errors; its
    result is never evaluated. Operands of several dtypes, and no keys, keep MLX's computation."""
    mlx_own = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    if q.dtype not in NARROW_FLOATS or k.dtype != q.dtype or v.dtype != q.dtype or k.shape[2] == 0:
        return mlx_own
    (batch, heads, queries, _), (kv_heads, keys) = q.shape, k.shape[1:3]
    groups = heads // kv_heads
    q = q * mx.array(scale, q.dtype)
    if groups > 1:
        q, k, v = mx.unflatten(q, 1, (kv_heads, groups)), mx.expand_dims(k, 2), mx.expand_dims(v, 2)
    scores = q @ mx.swapaxes(k, -1, -2)
    if isinstance(mask, str):  # "causal", aligned to the last key as MLX's
        mask = mx.arange(keys - queries, keys)[:, None] >= mx.arange(keys)[None]
    elif mask is not None:
        mask = mx.broadcast_to(mask if mask.dtype == mx.bool_ else mask.astype(q.dtype), (batch, heads, queries, keys))
        mask = mx.unflatten(mask, 1, (kv_heads, groups)) if groups > 1 else mask
    if mask is not None:
        scores = mx.where(mask, scores, mx.finfo(scores.dtype).min) if mask.dtype == mx.bool_ else scores + mask
    out = softmax(scores, -1) @ v
    return mx.flatten(out, 1, 2) if groups > 1 else out


def silu(x: mx.array) -> mx.array:
    """mlx.nn.silu's operations, with this sigmoid."""
    return x * sigmoid(x)


def gelu(x: mx.array) -> mx.array:
    """mlx.nn.gelu's operations, with this erf."""
    return x * (1 + rational_erf(x / math.sqrt(2))) / 2


def _for_float32_and_narrower(fast, mlx_own):
    return lambda x: fast(x) if x.dtype in NARROW_FLOATS else mlx_own(x)


UNARY_OP = {
    UnaryOp.Erf: _for_float32_and_narrower(rational_erf, mx.erf),
    UnaryOp.GeluErf: _for_float32_and_narrower(gelu, nn.gelu),
    UnaryOp.Exp: _for_float32_and_narrower(exp, mx.exp),
    UnaryOp.Sigmoid: _for_float32_and_narrower(sigmoid, mx.sigmoid),
    UnaryOp.Silu: _for_float32_and_narrower(silu, nn.silu),
}


def gated_delta_chunks(q, k, v, gamma, beta, state):
    """``mx.fast.gated_delta_update`` over many tokens as matrix products, chunk by
    chunk: MLX's CPU backend runs the rule a token at a time (~8x slower at 128 tokens
    of 16 heads of 128). Within a chunk the delta rule's updates are resolved at once
    (the inverse of a unit lower-triangular matrix: the WY form of FLA's and
    transformers' chunked kernels); the state carries between chunks. Shapes as
    ``GatedDelta``'s; float32."""
    repeat = v.shape[2] // q.shape[2]
    if repeat > 1:
        q, k = mx.repeat(q, repeat, 2), mx.repeat(k, repeat, 2)
    q, k, v = (mx.swapaxes(x, 1, 2) for x in (q, k, v))  # (B, H, T, D)
    log_decay = mx.maximum(mx.log(mx.swapaxes(gamma, 1, 2)), GATED_DELTA_LEAST_LOG)
    beta = mx.swapaxes(beta, 1, 2)
    memory = mx.swapaxes(state, -1, -2)  # (B, H, Dk, Dv)
    outputs = []
    for start in range(0, q.shape[2], GATED_DELTA_CHUNK):
        chunk = slice(start, start + GATED_DELTA_CHUNK)
        qc, kc, vc, decays, rates = (x[:, :, chunk] for x in (q, k, v, log_decay, beta))
        output, memory = _gated_delta_chunk(qc, kc, vc, decays, rates, memory)
        outputs.append(output)
    output = outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=2)
    return mx.swapaxes(output, 1, 2), mx.swapaxes(memory, -1, -2)


def _gated_delta_chunk(q, k, v, log_decay, beta, memory):
    """One chunk of n tokens from ``memory`` (B, H, Dk, Dv): (its output, the memory after it)."""
    n = q.shape[2]
    total = mx.cumsum(log_decay, axis=-1)  # (B, H, n): the decay since the chunk began
    causal = mx.tril(mx.ones((n, n), dtype=mx.bool_))
    between = mx.where(causal, mx.exp(mx.where(causal, total[..., :, None] - total[..., None, :], 0.0)), 0.0)
    weighted = k * beta[..., None]
    earlier = mx.tril(mx.ones((n, n), dtype=mx.bool_), -1)
    interaction = mx.where(earlier, (weighted @ mx.swapaxes(k, -1, -2)) * between, 0.0)
    resolve = mx.linalg.tri_inv(interaction + mx.eye(n, dtype=mx.float32), upper=False, stream=mx.cpu)
    decayed = mx.exp(total)[..., None]
    updates = resolve @ (v * beta[..., None]) - (resolve @ (weighted * decayed)) @ memory
    scores = mx.where(causal, (q @ mx.swapaxes(k, -1, -2)) * between, 0.0)
    output = (q * decayed) @ memory + scores @ updates
    last = total[..., -1:]
    memory = memory * mx.exp(last)[..., None] + mx.swapaxes(k * mx.exp(last - total)[..., None], -1, -2) @ updates
    return output, memory
