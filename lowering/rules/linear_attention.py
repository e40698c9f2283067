"""Linear attention and state spaces: the gated delta rule of Qwen3.5's and Qwen3-Next's
recurrent layers on ``mx.fast.gated_delta_update`` (``etmlx::gated_delta``), and Mamba's
selective scan (``etmlx::selective_scan``), both written by
``etmlx/llm/recurrent_kernels.py``."""

import torch

from etmlx.serializer.generated.etmlx_ir import GatedDelta, SelectiveScan

from ..registry import lowers
from .common import example_of, used_outputs

# gated_delta's operands, in its order; the output and the state follow them.
OPERANDS = ("q", "k", "v", "gamma", "beta", "state")


def _check_gated_delta(node, args):
    """MLX's kernel takes the shapes ``etmlx::gated_delta`` documents, in float32."""
    q, k, v, gamma, beta, state = (example_of(getattr(args, name)) for name in OPERANDS)
    if any(x.dtype != torch.float32 for x in (q, k, v, gamma, beta, state)):
        return "operands other than float32 (the recurrent state is kept in float32)"
    if (q.dim(), k.dim(), v.dim(), gamma.dim(), beta.dim(), state.dim()) != (4, 4, 4, 3, 3, 4):
        return "operands of other ranks than q, k, v (B, T, H, D), gamma, beta (B, T, Hv), state (B, Hv, Dv, Dk)"
    batch, steps, key_heads, key_size = q.shape
    value_heads, value_size = v.shape[2:]
    if not all(isinstance(size, int) for size in (batch, key_heads, key_size, value_heads, value_size)):
        return "dynamic batch, head counts or head sizes"
    if k.shape != q.shape or v.shape[:2] != (batch, steps) or gamma.shape != beta.shape \
            or gamma.shape != (batch, steps, value_heads) or state.shape != (batch, value_heads, value_size, key_size):
        return "operand shapes that do not agree"
    if value_heads % key_heads:
        return f"{value_heads} value heads for {key_heads} key heads"
    return None


def _node_per_result(table, names):
    """A lowering to one ``table`` node per result the graph uses (0: the output, 1: the
    state after the last step); the runtimes compute the pair once."""
    def lower(ctx, node, args):
        operands = {name: ctx.tensor(getattr(args, name)) for name in names}
        for part in sorted(used_outputs(node)):
            ctx.bind(node, ctx.emit(table, **operands, finalState=part == 1), index=part)
    return lower


lowers("etmlx::gated_delta", check=_check_gated_delta)(_node_per_result(GatedDelta, OPERANDS))


# selective_scan's operands, in its order.
SCAN_OPERANDS = ("x", "dt", "a", "b", "c", "state")


def _check_selective_scan(node, args):
    """The runtimes' scan takes the shapes ``etmlx::selective_scan`` documents, in float32."""
    x, dt, a, b, c, state = (example_of(getattr(args, name)) for name in SCAN_OPERANDS)
    if any(t.dtype != torch.float32 for t in (x, dt, a, b, c, state)):
        return "operands other than float32 (the state is kept in float32)"
    if (x.dim(), dt.dim(), a.dim(), b.dim(), c.dim(), state.dim()) != (3, 3, 2, 3, 3, 3):
        return "operands of other ranks than x, dt (B, T, D), a (D, N), b, c (B, T, N), state (B, D, N)"
    batch, steps, channels = x.shape
    size = a.shape[1]
    if not all(isinstance(n, int) for n in (batch, channels, size)):
        return "dynamic batch, channel count or state size"
    if dt.shape != x.shape or b.shape != c.shape or b.shape != (batch, steps, size) \
            or a.shape != (channels, size) or state.shape != (batch, channels, size):
        return "operand shapes that do not agree"
    return None


lowers("etmlx::selective_scan", check=_check_selective_scan)(_node_per_result(SelectiveScan, SCAN_OPERANDS))
