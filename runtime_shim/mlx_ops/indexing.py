import mlx.core as mx


def _key(op, env) -> tuple:
    key = [slice(None)] * (op.dims[-1] + 1)
    for dim, ref in zip(op.dims, op.indices):
        key[dim] = env.t(ref)
    return tuple(key)


def _index_put(op, env):
    x, key, values = env.t(op.x), _key(op, env), env.t(op.values)
    if op.accumulate:
        return x.at[key].add(values)
    out = mx.array(x)  # a new array: assigning to it leaves x (maybe a buffer's old state) alone
    out[key] = values
    return out


HANDLERS = {
    "TakeAlongAxis": lambda op, env: mx.take_along_axis(env.t(op.x), env.t(op.indices), axis=op.axis),
    "Index": lambda op, env: env.t(op.x)[_key(op, env)],
    "IndexPut": _index_put,
}
