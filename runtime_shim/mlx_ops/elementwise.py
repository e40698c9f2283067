import mlx.core as mx

from ..generated.mlx_functions import BINARY_OP, UNARY_OP
from . import cpu_math
from .env import MX_DTYPES, fill_value


def _unary(op, env):
    """MLX's function for the op, or on MLX's CPU the faster form of ``cpu_math``."""
    fast = cpu_math.UNARY_OP.get(op.op) if mx.default_device() == mx.cpu else None
    return (fast or UNARY_OP[op.op])(env.t(op.x))


def _as_type(op, env):
    x, dtype = env.t(op.x), MX_DTYPES[op.dtype]
    if mx.issubdtype(x.dtype, mx.floating) and mx.issubdtype(dtype, mx.integer):
        return _float_to_integer(x, dtype)
    return x.astype(dtype)


def _float_to_integer(x: mx.array, dtype) -> mx.array:
    """``x`` cast to an integer dtype, defined for every value and as PyTorch casts on
    x86: through int32 for int32 and narrower dtypes, else int64, where NaN and values out of range give the
    minimum ("integer indefinite"); narrower dtypes then wrap. A plain cast of those values
    is undefined behaviour in the C++ that mx.compile generates, and indices computed
    this way must stay clampable (indexing.py)."""
    through = mx.int32 if dtype == mx.int32 or dtype.size < 4 else mx.int64
    end = 2.0 ** (31 if through == mx.int32 else 63)  # a power of two: exact in float32
    wide = x.astype(mx.float32)  # exact for float16 and bfloat16
    indefinite = (wide < -end) | (wide >= end) | mx.isnan(wide)
    inside = mx.where(indefinite, 0.0, wide).astype(through)
    cast = mx.where(indefinite, mx.array(-end, dtype=mx.float32).astype(through), inside)
    return cast if dtype == through else cast.astype(dtype)


HANDLERS = {
    "Unary": _unary,
    "Binary": lambda op, env: BINARY_OP[op.op](env.t(op.a), env.t(op.b)),
    "Where": lambda op, env: mx.where(env.t(op.cond), env.t(op.a), env.t(op.b)),
    "AsType": _as_type,
    "Scalar": lambda op, env: fill_value(op),
}
