import mlx.core as mx

from .env import MX_DTYPES

HANDLERS = {
    "Full": lambda op, env: mx.full(env.sizes(op.shape or []), op.value, dtype=MX_DTYPES[op.dtype]),
    "Arange": lambda op, env: mx.arange(
        env.size(op.start), env.size(op.stop), op.step, dtype=MX_DTYPES[op.dtype]
    ),
}
