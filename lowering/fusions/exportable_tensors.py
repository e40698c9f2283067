"""Linear and embedding layers of ExecuTorch's exportable quantized weights
(``ExportableInt4Tensor``, ``ExportableMXTensor``, ``ExportableNVFP4Tensor``:
``rules/exportables.py``) on MLX's quantized kernels. After decomposition such a layer
is the weight's ``torchao::dequantize_*`` op feeding ``addmm``/``mm`` through a
transpose (a linear layer) or ``embedding``; matched here, the weight stays packed and
the layer is one ``QuantizedMatmul``, or a gather of packed rows then ``Dequantize``. A
weight read any other way is dequantized whole, once, at load.
"""

from etmlx.serializer.generated.etmlx_ir import Binary, QuantizedMatmul, Take
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp

from ..arguments import bind
from ..registry import is_call, op_name
from ..rules.exportables import EXPORTABLES, dequantized, packed, scaled
from ..rules.indexing import checked_index

NAME = "linear / embedding of ExecuTorch's exportable quantized tensors -> mx.quantized_matmul / packed rows"


def _dequantize_call(node) -> bool:
    return is_call(node, *EXPORTABLES)


def _transposed(node):
    """The exportable's dequantize call ``node`` transposes (a linear layer's weight), else None."""
    if not is_call(node, "aten::permute_copy") or list(bind(node).dims) not in ([1, 0], [-1, -2], [1, -2], [-1, 0]):
        return None
    weight = bind(node).self
    return weight if _dequantize_call(weight) else None


def match(ctx, node):
    """``("linear", x, bias, weight)`` or ``("embedding", ids, weight)``, else None; a
    check that declines the weight leaves the layer to its rules."""
    parts = _layer(node)
    if parts is None:
        return None
    weight = parts[-1]
    check = EXPORTABLES[op_name(weight.target)][0]
    return None if check(weight, bind(weight)) else parts


def _layer(node):
    if is_call(node, "aten::embedding"):
        args = bind(node)
        return ("embedding", args.indices, args.weight) if _dequantize_call(args.weight) else None
    if is_call(node, "aten::addmm"):
        args = bind(node)
        weight = _transposed(args.mat2)
        if weight is not None and args.beta == 1 and args.alpha == 1:
            return "linear", args.mat1, args.self, weight
    if is_call(node, "aten::mm"):
        args = bind(node)
        weight = _transposed(args.mat2)
        if weight is not None:
            return "linear", args.self, None, weight
    return None


def emit(ctx, node, parts) -> None:
    kind, *operands, weight_node = parts
    weight = packed(ctx, weight_node)
    if kind == "embedding":
        (ids,) = operands
        checked = checked_index(ctx, ids, bind(weight_node).qdata, 0, wraps=False)  # PyTorch rejects negative ids
        rows = {name: ctx.emit(Take, x=weight.fields[name], indices=checked, axis=0)
                for name in ("w", "scales", "biases") if name in weight.fields}
        ctx.bind(node, dequantized(ctx, weight, rows, bind(weight_node).output_dtype))
        return
    x, bias = operands
    out = scaled(ctx, ctx.emit(QuantizedMatmul, x=ctx.tensor(x), **weight.fields), weight)
    if bias is not None:
        out = ctx.emit(Binary, op=BinaryOp.Add, a=out, b=ctx.tensor(bias))
    ctx.bind(node, out)
