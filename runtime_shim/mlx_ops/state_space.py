"""SelectiveScan: Mamba's selective state-space scan, step by step from a stored state.

MLX has no kernel for it; the per-step work is one multiply-add over the (B, D, N)
state, with the decays, inputs and readout made for all steps at once around the loop.
"""

import mlx.core as mx


def _selective_scan(op, env):
    """Both results, made once per call for the output node and the state node of the
    same operands."""
    operands = [op.x, op.dt, op.a, op.b, op.c, op.state]
    key = ("selective_scan", *(ref.idx for ref in operands))
    results = env.shared(key, lambda: selective_scan(*(env.t(ref) for ref in operands)))
    return results[1 if op.finalState else 0]


def selective_scan(x, dt, a, b, c, state):
    """``etmlx::selective_scan``: x, dt (B, T, D); a (D, N); b, c (B, T, N); state
    (B, D, N); the output (B, T, D) and the state after the last step."""
    if (x.ndim, dt.ndim, a.ndim, b.ndim, c.ndim, state.ndim) != (3, 3, 2, 3, 3, 3) or \
            any(t.dtype != mx.float32 for t in (x, dt, a, b, c, state)):
        raise ValueError("selective scan over operands of other ranks or dtypes than float32 x, dt (B, T, D), "
                         "a (D, N), b, c (B, T, N), state (B, D, N)")
    batch, steps, channels = x.shape
    size = a.shape[1]
    if dt.shape != x.shape or a.shape != (channels, size) or b.shape != (batch, steps, size) or c.shape != b.shape \
            or state.shape != (batch, channels, size) or steps < 1:
        raise ValueError(f"selective scan over x {x.shape}, dt {dt.shape}, a {a.shape}, b {b.shape}, c {c.shape}, "
                         f"state {state.shape}: shapes that do not agree")
    decays = mx.exp(mx.expand_dims(dt, -1) * a)  # (B, T, D, N)
    inputs = mx.expand_dims(dt * x, -1) * mx.expand_dims(b, 2)
    states = []
    for t in range(steps):
        state = mx.take(decays, t, axis=1) * state + mx.take(inputs, t, axis=1)
        states.append(state)
    output = (mx.stack(states, axis=1) * mx.expand_dims(c, 2)).sum(-1)
    return output, state


HANDLERS = {"SelectiveScan": _selective_scan}
