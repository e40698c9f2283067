"""A batched matmul with one operand gathered by index from a stack of matrices,
``bmm(x, W[ids])`` or ``bmm(W[ids], x)``, as one ``GatherMm`` node (``mx.gather_mm``),
or ``GatherQmm`` (``mx.gather_qmm``) when the stack is quantized (``W[ids]`` is then
``etmlx::quantized_stack_take``, see ``fusions/quantized_weights.py``).

This is a mixture of experts' expert computation (transformers' ``batched_mm`` experts:
the weights of each token's chosen experts gathered, then one matmul per token and
expert). Written out, the gather copies a whole weight matrix per token and expert;
``gather_mm`` reads each expert's weights in place. Matched at the ``bmm`` when ``W`` is
(E, ., .), ``ids`` the only index, on dim 0, and provably within E: the positions a
``topk`` or ``sort`` over E values returns (a router's chosen experts), so no run-time
bounds check is lost. Anything else stays a gather and a matmul.
"""

from etmlx.serializer.generated.etmlx_ir import GatherMm, GatherQmm, Transpose

from ..arguments import bind
from ..registry import is_call
from ..rules.common import rank_of, shape_of
from ..rules.indexing import sorted_positions_bound
from ..rules.quantized import packed_stack

QUANTIZED_TAKE = "etmlx::quantized_stack_take"

NAME = "batched matmul of gathered matrices -> mx.gather_mm"

_SWAP_LAST = [0, 2, 1]


def _gathered(node):
    """``(W, ids, quantized)`` when ``node`` is ``W[ids]`` of that form, else None;
    ``quantized`` is the bound arguments of a ``quantized_stack_take`` (W its int8
    values), or None for a float stack."""
    if is_call(node, QUANTIZED_TAKE):
        quantized = bind(node)
        stack, indices = quantized.qdata, [quantized.indices]
    elif is_call(node, "aten::index.Tensor"):
        quantized, gather = None, bind(node)
        stack, indices = gather.self, list(gather.indices)
    else:
        return None
    if rank_of(stack) != 3 or len(indices) != 1 or indices[0] is None or rank_of(indices[0]) != 1:
        return None
    bound = sorted_positions_bound(indices[0])
    if bound is None or bound > shape_of(stack)[0]:
        return None
    return stack, indices[0], quantized


def _transposed_stack(ctx, stack):
    """W with its matrices transposed: stored so when W is a weight (MLX's CPU gather_mm
    runs about 1.3x faster on contiguous matrices than through a transposed view), else
    a Transpose node."""
    if ctx.is_constant(stack):
        return ctx.add_constant(ctx.constant_values[stack].transpose(1, 2).contiguous())
    return ctx.emit(Transpose, x=ctx.tensor(stack), perm=_SWAP_LAST)


def match(ctx, node):
    """``(x, W, ids, quantized, W_on_the_right)`` when ``node`` is such a bmm, else None."""
    if not is_call(node, "aten::bmm"):
        return None
    product = bind(node)
    for gathered_operand, other, on_the_right in ((product.mat2, product.self, True), (product.self, product.mat2, False)):
        parts = _gathered(gathered_operand)
        if parts is not None:
            return other, *parts, on_the_right
    return None


def emit(ctx, node, parts) -> None:
    x, stack, ids, quantized, on_the_right = parts
    if quantized is not None:
        _emit_quantized(ctx, node, x, quantized, ids, on_the_right)
        return
    if on_the_right:  # x[i] @ W[ids[i]]
        ctx.bind(node, ctx.emit(GatherMm, a=ctx.tensor(x), b=ctx.tensor(stack), rhsIndices=ctx.tensor(ids)))
        return
    # W[ids[i]] @ x[i] == (x[i]^T @ W[ids[i]]^T)^T
    x_t = ctx.emit(Transpose, x=ctx.tensor(x), perm=_SWAP_LAST)
    stack_t = ctx.once(("transposed stack", stack), lambda: _transposed_stack(ctx, stack))
    product = ctx.emit(GatherMm, a=x_t, b=stack_t, rhsIndices=ctx.tensor(ids))
    ctx.bind(node, ctx.emit(Transpose, x=product, perm=_SWAP_LAST))


def _emit_quantized(ctx, node, x, take, ids, on_the_right) -> None:
    """Quantized rows run along a matrix's last dim: W[ids] @ x is x^T times W
    transposed, MLX's natural layout; x @ W[ids] multiplies by W as it is."""
    packed = packed_stack(ctx, take)
    if on_the_right:
        ctx.bind(node, ctx.emit(GatherQmm, x=ctx.tensor(x), rhsIndices=ctx.tensor(ids), transpose=False, **packed))
        return
    x_t = ctx.emit(Transpose, x=ctx.tensor(x), perm=_SWAP_LAST)
    product = ctx.emit(GatherQmm, x=x_t, rhsIndices=ctx.tensor(ids), transpose=True, **packed)
    ctx.bind(node, ctx.emit(Transpose, x=product, perm=_SWAP_LAST))
