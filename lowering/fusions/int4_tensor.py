"""Linear and embedding layers of ExecuTorch's ``ExportableInt4Tensor`` weights on MLX's
quantized kernels. After decomposition such a layer is ``dequantize_int4_tensor`` feeding
``addmm``/``mm`` through a transpose (a linear layer) or ``embedding``; matched here, the
weight stays packed (``rules/quantized.py`` repacks it once, at export) and the layer
is one ``QuantizedMatmul``, or a gather of packed rows then ``Dequantize``. A weight read
any other way is dequantized whole, once, at load.
"""

from etmlx.serializer.generated.etmlx_ir import Binary, Dequantize, QuantizedMatmul, Take
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp

from ..arguments import bind
from ..registry import is_call
from ..rules.indexing import checked_index
from ..rules.quantized import INT4_TENSOR, int4_tensor_weight

NAME = "linear / embedding of an ExportableInt4Tensor -> mx.quantized_matmul / packed rows"


def _transposed_int4(node):
    """The ``dequantize_int4_tensor`` call ``node`` transposes (a linear layer's weight), else None."""
    if not is_call(node, "aten::permute_copy") or list(bind(node).dims) not in ([1, 0], [-1, -2], [1, -2], [-1, 0]):
        return None
    weight = bind(node).self
    return weight if is_call(weight, INT4_TENSOR) else None


def match(ctx, node):
    """``("linear", x, bias, weight)`` or ``("embedding", ids, weight)``, else None."""
    if is_call(node, "aten::embedding"):
        args = bind(node)
        return ("embedding", args.indices, args.weight) if is_call(args.weight, INT4_TENSOR) else None
    if is_call(node, "aten::addmm"):
        args = bind(node)
        weight = _transposed_int4(args.mat2)
        if weight is not None and args.beta == 1 and args.alpha == 1:
            return "linear", args.mat1, args.self, weight
    if is_call(node, "aten::mm"):
        args = bind(node)
        weight = _transposed_int4(args.mat2)
        if weight is not None:
            return "linear", args.self, None, weight
    return None


def emit(ctx, node, parts) -> None:
    kind, *operands, weight = parts
    packed = int4_tensor_weight(ctx, bind(weight))
    if kind == "embedding":
        (ids,) = operands
        checked = checked_index(ctx, ids, bind(weight).qdata, 0, wraps=False)  # PyTorch rejects negative ids
        rows = {name: ctx.emit(Take, x=packed[name], indices=checked, axis=0) for name in ("w", "scales", "biases")}
        ctx.bind(node, ctx.emit(Dequantize, **rows, groupSize=packed["groupSize"], bits=packed["bits"]))
        return
    x, bias = operands
    out = ctx.emit(QuantizedMatmul, x=ctx.tensor(x), **packed)
    if bias is not None:
        out = ctx.emit(Binary, op=BinaryOp.Add, a=out, b=ctx.tensor(bias))
    ctx.bind(node, out)
