import mlx.core as mx

from ..errors import IndexRangeError


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


def _check_index(op, env):
    """Records whether any index is out of range (evaluated with the call's results, see
    CheckIndex in schema.fbs) and returns the indices made safe to gather with."""
    indices, size = env.t(op.indices), env.size(op.size)
    if indices.dtype not in (mx.int32, mx.int64):
        indices = indices.astype(mx.int64)  # so size - 1 is representable below
    if indices.size == 0:
        env.checks.append(mx.array([0, 0, size], dtype=mx.int64))
        return indices
    if size == 0:
        raise IndexRangeError(f"{op.what} indexes a dimension of size 0")
    wrapped = mx.where(indices < 0, indices + size, indices) if op.wraps else indices
    bad = ((wrapped < 0) | (wrapped >= size)).reshape(-1)
    first = mx.take(indices.reshape(-1), mx.argmax(bad.astype(mx.uint8)))
    env.checks.append(mx.stack([mx.any(bad).astype(mx.int64), first.astype(mx.int64), mx.array(size, mx.int64)]))
    return mx.clip(wrapped, 0, size - 1)


def index_error(what: str, wraps: bool, first: int, size: int) -> IndexRangeError:
    """The error a failed CheckIndex raises, in PyTorch's terms."""
    valid = f"{-size} to {size - 1}" if wraps else f"0 to {size - 1}"
    return IndexRangeError(f"{what} holds index {first}, out of range for a dimension of size {size} (valid: {valid})")


HANDLERS = {
    "CheckIndex": _check_index,
    "TakeAlongAxis": lambda op, env: mx.take_along_axis(env.t(op.x), env.t(op.indices), axis=op.axis),
    "Index": lambda op, env: env.t(op.x)[_key(op, env)],
    "IndexPut": _index_put,
}
