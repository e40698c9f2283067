"""RMS normalization written out Llama-style, ``x * rsqrt(mean(x ** 2, -1, keepdim=True)
+ eps)``, as one ``RmsNorm`` node (``mx.fast.rms_norm``). Matched at the multiply; the
pieces it replaces are removed afterwards as dead nodes (``lowering/passes.py``)."""

import torch
from torch import fx

from etmlx.serializer.generated.etmlx_ir import RmsNorm

from ..registry import op_name
from ..rules.common import rank_of

NAME = "RMS norm -> mx.fast.rms_norm"


def _call(node, *names) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and op_name(node.target) in names


def match(ctx, node):
    """``(x, eps)`` when ``node`` is that multiply, else None."""
    if not _call(node, "aten::mul.Tensor"):
        return None
    a, b = node.args[:2]
    for x, inverse in ((a, b), (b, a)):
        if not _call(inverse, "aten::rsqrt") or not _call(inverse.args[0], "aten::add.Tensor", "aten::add.Scalar"):
            continue
        mean, eps = inverse.args[0].args[:2]
        if ctx.is_constant(eps) and ctx.constant_values[eps].numel() == 1:
            eps = ctx.constant_values[eps].item()
        if not isinstance(eps, (int, float)) or not _call(mean, "aten::mean.dim"):
            continue
        dims, keepdim = mean.args[1], (mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False))
        square = mean.args[0]
        over_last_axis = list(dims) in ([-1], [rank_of(x) - 1])
        if not keepdim or not over_last_axis or not _call(square, "aten::pow.Tensor_Scalar"):
            continue
        if square.args[0] is x and square.args[1] == 2 and x.meta["val"].dtype in (torch.float32, torch.float16, torch.bfloat16):
            return x, float(eps)
    return None


def emit(ctx, node, parts) -> None:
    x, eps = parts
    ctx.bind(node, ctx.emit(RmsNorm, x=ctx.tensor(x), hasWeight=False, eps=eps))
