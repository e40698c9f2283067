"""Functions MLX's CPU backend computes slowly, as products and sums that
``mx.compile`` fuses into one loop. ``mx.erf`` over a ViT-B MLP's activations
(197 x 3072) takes ~22 ms on MLX's CPU, this form ~2 ms (torch: 0.5 ms); on a GPU the
runtimes call MLX's own. The native backend evaluates the same operations in the same
order (native/src/mlx_ops/cpu_math.cpp), so both runtimes agree to the bit."""

import math

import mlx.core as mx
import mlx.nn as nn

from etmlx.serializer.constants import ERF_CLAMP, ERF_DENOMINATOR, ERF_NUMERATOR
from etmlx.serializer.generated.etmlx_ir.UnaryOp import UnaryOp


def _polynomial(coefficients: tuple, x: mx.array) -> mx.array:
    """Horner's rule, coefficients from the lowest power up."""
    total = mx.array(coefficients[-1], dtype=x.dtype)
    for c in coefficients[-2::-1]:
        total = total * x + c
    return total


def rational_erf(x: mx.array) -> mx.array:
    """erf as the rational function of ``serializer/fit_erf.py``, in float32 (at most
    6 ulps from exact; half precision is widened, then rounded once)."""
    clamped = mx.clip(x.astype(mx.float32), -ERF_CLAMP, ERF_CLAMP)
    square = clamped * clamped
    ratio = _polynomial(ERF_NUMERATOR, square) / _polynomial(ERF_DENOMINATOR, square)
    return mx.clip(clamped * ratio, -1.0, 1.0).astype(x.dtype)


def gelu(x: mx.array) -> mx.array:
    """mlx.nn.gelu's operations, with this erf."""
    return x * (1 + rational_erf(x / math.sqrt(2))) / 2


_WIDTHS = (mx.float32, mx.float16, mx.bfloat16)  # float64 and integers keep MLX's own


def _for_float32_and_narrower(fast, mlx_own):
    return lambda x: fast(x) if x.dtype in _WIDTHS else mlx_own(x)


UNARY_OP = {
    UnaryOp.Erf: _for_float32_and_narrower(rational_erf, mx.erf),
    UnaryOp.GeluErf: _for_float32_and_narrower(gelu, nn.gelu),
}
