import mlx.core as mx


def _slice(op, env):
    """PyTorch clamps slice bounds to the dim (an open end arrives as INT64_MAX);
    MLX rejects indices that do not fit 32 bits, so clamp as Python's slice does."""
    x = env.t(op.x)
    start, stop, step = slice(env.size(op.start), env.size(op.stop), op.step).indices(x.shape[op.axis])
    index = [slice(None)] * op.axis + [slice(start, stop, step)]
    return x[tuple(index)]


def _pad(op, env):
    x = env.t(op.x)
    width = list(op.padWidth)
    pairs = [(width[i], width[i + 1]) for i in range(0, len(width), 2)]
    return mx.pad(x, pairs, constant_values=mx.array(op.value, dtype=x.dtype))


HANDLERS = {
    "Pad": _pad,
    "Reshape": lambda op, env: mx.reshape(env.t(op.x), env.sizes(op.shape)),
    "Transpose": lambda op, env: mx.transpose(env.t(op.x), list(op.perm)),
    "ExpandDims": lambda op, env: mx.expand_dims(env.t(op.x), list(op.axes)),
    "Squeeze": lambda op, env: mx.squeeze(env.t(op.x), list(op.axes)),
    "BroadcastTo": lambda op, env: mx.broadcast_to(env.t(op.x), env.sizes(op.shape)),
    "Slice": _slice,
    "Concatenate": lambda op, env: mx.concatenate([env.t(x) for x in op.xs], axis=op.axis),
    "Tile": lambda op, env: mx.tile(env.t(op.x), list(op.reps)),
}
