import mlx.core as mx

from .env import MX_DTYPES, fill_value


def _full(op, env):
    """``mx.full(shape, 1.0, dtype=mx.int32)`` returns float32 (mlx 0.32 ignores the
    dtype for a Python float), so the fill value is made an array of the dtype first."""
    return mx.full(env.sizes(op.shape or []), fill_value(op))


def _random_uniform(op, env):
    """The key ``mx.random.key(seed)`` makes, built from the seed in the graph (its high
    and low 32 bits), so a compiled graph draws anew for each seed it is given."""
    seed = env.t(op.seed)
    if not mx.issubdtype(seed.dtype, mx.integer) or seed.size != 1:
        raise ValueError(f"RandomUniform: a seed of dtype {seed.dtype} and shape {seed.shape} (one integer)")
    seed = seed.reshape([]).astype(mx.int64)
    key = mx.stack([(seed >> 32).astype(mx.uint32), seed.astype(mx.uint32)])
    return mx.random.uniform(shape=env.sizes(op.shape), key=key)


HANDLERS = {
    "Full": _full,
    "Arange": lambda op, env: mx.arange(
        env.size(op.start), env.size(op.stop), op.step, dtype=MX_DTYPES[op.dtype]
    ),
    "RandomUniform": _random_uniform,
}
