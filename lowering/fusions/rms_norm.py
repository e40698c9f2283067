"""RMS normalization written out Llama-style, ``x * rsqrt(mean(x ** 2, -1, keepdim=True)
+ eps)``, as one ``RmsNorm`` node (``mx.fast.rms_norm``). Matched at the multiply; the
pieces it replaces are removed afterwards as dead nodes (``lowering/passes.py``)."""

import torch

from etmlx.serializer.generated.etmlx_ir import RmsNorm

from ..arguments import bind
from ..registry import is_call
from ..rules.common import rank_of

NAME = "RMS norm -> mx.fast.rms_norm"


def match(ctx, node):
    """``(x, eps)`` when ``node`` is that multiply, else None."""
    if not is_call(node, "aten::mul.Tensor"):
        return None
    product = bind(node)
    for x, inverse in ((product.self, product.other), (product.other, product.self)):
        if not is_call(inverse, "aten::rsqrt") or not is_call(bind(inverse).self, "aten::add.Tensor", "aten::add.Scalar"):
            continue
        plus_eps = bind(bind(inverse).self)
        mean, eps = plus_eps.self, plus_eps.other
        if ctx.is_constant(eps) and ctx.constant_values[eps].numel() == 1:
            eps = ctx.constant_values[eps].item()
        if plus_eps.alpha != 1 or not isinstance(eps, (int, float)) or not is_call(mean, "aten::mean.dim"):
            continue
        average = bind(mean)
        square = average.self
        over_last_axis = average.dim is not None and list(average.dim) in ([-1], [rank_of(x) - 1])
        if not average.keepdim or average.dtype is not None or not over_last_axis:
            continue
        if not is_call(square, "aten::pow.Tensor_Scalar"):
            continue
        powered = bind(square)
        if powered.self is x and powered.exponent == 2 and x.meta["val"].dtype in (torch.float32, torch.float16, torch.bfloat16):
            return x, float(eps)
    return None


def emit(ctx, node, parts) -> None:
    x, eps = parts
    ctx.bind(node, ctx.emit(RmsNorm, x=ctx.tensor(x), hasWeight=False, eps=eps))
