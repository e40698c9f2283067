import mlx.core as mx

from .env import MX_DTYPES, fill_value


def _full(op, env):
    """``mx.full(shape, 1.0, dtype=mx.int32)`` returns float32 (mlx 0.32 ignores the
    dtype for a Python float), so the fill value is made an array of the dtype first."""
    return mx.full(env.sizes(op.shape or []), fill_value(op))


HANDLERS = {
    "Full": _full,
    "Arange": lambda op, env: mx.arange(
        env.size(op.start), env.size(op.stop), op.step, dtype=MX_DTYPES[op.dtype]
    ),
}
