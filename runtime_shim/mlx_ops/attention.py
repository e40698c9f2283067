import mlx.core as mx

from . import cpu_math


def _sdpa(op, env):
    """MLX's fused attention, or on MLX's CPU (where MLX computes it from products and a
    softmax anyway) the same computation with ``cpu_math``'s faster softmax."""
    mask = env.t(op.mask) if op.hasMask else ("causal" if op.causal else None)
    q, k, v = env.t(op.q), env.t(op.k), env.t(op.v)
    if mx.default_device() == mx.cpu:
        return cpu_math.attention(q, k, v, op.scale, mask)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=op.scale, mask=mask)


def _rope(op, env):
    """``mx.fast.rope``, a kernel on a GPU. On the CPU MLX computes it as cosines and
    sines then products, per node: there the same products are written out here, with the
    cosines and sines made once for all the Rope nodes at the same positions (the q and k
    of every layer), which halves its cost."""
    x, offset, freqs = env.t(op.x), env.t(op.offset), env.t(op.freqs)
    _check_rope(x, op.dims, offset, freqs)
    if mx.default_device() != mx.cpu:
        return mx.fast.rope(x, op.dims, traditional=False, base=None, scale=1.0, offset=offset, freqs=freqs)
    key = ("rope", op.offset.idx, op.freqs.idx, x.shape[-2], x.dtype)
    cos, sin = env.shared(key, lambda: _rope_cos_sin(x.shape[-2], offset, freqs, x.dtype))
    half = op.dims // 2
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def _check_rope(x, dims, offset, freqs):
    if x.ndim < 3 or not mx.issubdtype(x.dtype, mx.floating) or dims != x.shape[-1] or dims % 2:
        raise ValueError(f"rope over {dims} of a {x.dtype} tensor of shape {x.shape}")
    if offset.size != 1 or not mx.issubdtype(offset.dtype, mx.integer):
        raise ValueError(f"rope offset of dtype {offset.dtype} and shape {offset.shape}: expected one integer")
    if freqs.shape != (dims // 2,) or freqs.dtype != mx.float32:
        raise ValueError(f"rope frequencies of dtype {freqs.dtype} and shape {freqs.shape}: expected {dims // 2} float32")


def _rope_cos_sin(tokens, offset, freqs, dtype):
    """MLX's own CPU computation of rope's angles (mlx/fast.cpp), in its order."""
    positions = mx.arange(tokens, dtype=mx.float32) + offset.reshape([]).astype(mx.int32)
    angles = positions[:, None] * mx.reciprocal(freqs)
    return mx.cos(angles).astype(dtype), mx.sin(angles).astype(dtype)


def _gated_delta(op, env):
    """Both of ``mx.fast.gated_delta_update``'s results, made once per call for the
    output node and the state node of the same operands."""
    operands = [op.q, op.k, op.v, op.gamma, op.beta, op.state]
    key = ("gated_delta", *(ref.idx for ref in operands))
    results = env.shared(key, lambda: _gated_delta_update(*(env.t(ref) for ref in operands)))
    return results[1 if op.finalState else 0]


def _gated_delta_update(q, k, v, gamma, beta, state):
    if (q.ndim, k.ndim, v.ndim, gamma.ndim, beta.ndim, state.ndim) != (4, 4, 4, 3, 3, 4) or \
            any(x.dtype != mx.float32 for x in (q, k, v, gamma, beta, state)):
        raise ValueError("gated delta rule over operands of other ranks or dtypes than float32 q, k, v (B, T, H, D), "
                         "gamma, beta (B, T, Hv), state (B, Hv, Dv, Dk)")
    batch, steps, key_heads, key_size = q.shape
    value_heads, value_size = v.shape[2:]
    if k.shape != q.shape or v.shape[:2] != (batch, steps) or gamma.shape != (batch, steps, value_heads) \
            or beta.shape != gamma.shape or state.shape != (batch, value_heads, value_size, key_size) \
            or steps < 1 or key_heads < 1 or value_heads % key_heads:
        raise ValueError(f"gated delta rule over q {q.shape}, v {v.shape}, gamma {gamma.shape}, beta {beta.shape}, "
                         f"state {state.shape}: shapes that do not agree")
    if steps > 1 and mx.default_device() == mx.cpu:
        return cpu_math.gated_delta_chunks(q, k, v, gamma, beta, state)
    return mx.fast.gated_delta_update(q, k, v, gamma, beta, state)


HANDLERS = {
    "Sdpa": _sdpa,
    "GatedDelta": _gated_delta,
    "Rope": _rope,
    "Roll": lambda op, env: mx.roll(env.t(op.x), list(op.shifts), axis=list(op.axes)),
}
