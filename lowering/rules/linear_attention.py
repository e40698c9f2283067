"""Linear attention: the gated delta rule of Qwen3.5's and Qwen3-Next's recurrent layers
on ``mx.fast.gated_delta_update`` (``etmlx::gated_delta``, written by
``etmlx/llm/recurrent_state.py``)."""

import torch

from etmlx.serializer.generated.etmlx_ir import GatedDelta

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


@lowers("etmlx::gated_delta", check=_check_gated_delta)
def _lower_gated_delta(ctx, node, args):
    operands = {name: ctx.tensor(getattr(args, name)) for name in OPERANDS}
    for part in sorted(used_outputs(node)):
        ctx.bind(node, ctx.emit(GatedDelta, **operands, finalState=part == 1), index=part)
