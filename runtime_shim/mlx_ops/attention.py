import mlx.core as mx


def _sdpa(op, env):
    mask = env.t(op.mask) if op.hasMask else ("causal" if op.causal else None)
    return mx.fast.scaled_dot_product_attention(env.t(op.q), env.t(op.k), env.t(op.v), scale=op.scale, mask=mask)


HANDLERS = {
    "Sdpa": _sdpa,
    "Roll": lambda op, env: mx.roll(env.t(op.x), list(op.shifts), axis=list(op.axes)),
}
