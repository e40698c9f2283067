"""Linear and embedding layers over torchao's ``dequantize_affine`` weights, and matrices
picked from a quantized stack (experts), retargeted before decomposition to
``etmlx::quantized_linear`` / ``etmlx::quantized_embedding`` /
``etmlx::quantized_stack_take`` (MLX's quantized kernels; lowering/rules/quantized.py
repacks the weights at export).

The weight's parts reach the traced graph either as plain parameters (a model whose
tensor subclasses were unwrapped) or through ``access_subclass_inner_tensor`` on the
quantized parameter (what ``torch.export`` writes for torchao's tensor subclasses);
either way they are fixed at export, which the check makes sure of.
"""

from typing import Optional

import torch
from torch import fx

from etmlx.lowering.arguments import bind
from etmlx.lowering.registry import is_call, is_frozen_placeholder
from etmlx.lowering.rules.common import dtype_of, example_of
from etmlx.lowering.rules.quantized import bits_of, check_fixed_at_export, check_quantized_weight

DEQUANTIZE = "torchao::dequantize_affine"
_INNER_TENSOR = "export::access_subclass_inner_tensor"


def _dequantized(weight) -> Optional[fx.Node]:
    """The ``dequantize_affine`` call ``weight`` is, else None."""
    return weight if is_call(weight, DEQUANTIZE) else None


def _fixed_at_export(node) -> bool:
    """A frozen placeholder (weight, frozen buffer, constant), or an inner tensor of one."""
    return is_frozen_placeholder(node.args[0] if is_call(node, _INNER_TENSOR) else node)


def _check(dequantize: fx.Node, dtype) -> Optional[str]:
    weight = bind(dequantize)
    reason = check_fixed_at_export((weight.input, weight.scale, weight.zero_point), _fixed_at_export)
    if reason:
        return reason
    if weight.input_dtype != torch.int8 or weight.output_dtype != dtype:
        return f"{weight.input_dtype} storage dequantized to {weight.output_dtype} for {dtype} activations"
    bits = bits_of(weight.quant_min, weight.quant_max)
    if bits is None:
        return f"the quantization range [{weight.quant_min}, {weight.quant_max}] (etmlx takes signed ones)"
    return check_quantized_weight(
        example_of(weight.input), example_of(weight.scale), example_of(weight.zero_point), weight.block_size, bits,
        dtype,
    )


def _parts(dequantize: fx.Node) -> tuple:
    """(qdata, scale, zero_point) and (group_size, bits) of an accepted weight."""
    weight = bind(dequantize)
    bits = bits_of(weight.quant_min, weight.quant_max)
    return (weight.input, weight.scale, weight.zero_point), (weight.block_size[-1], bits)


def reads_dequantized_weight(node) -> bool:
    """Whether a linear or embedding call's weight is a ``dequantize_affine``."""
    return _dequantized(bind(node).weight) is not None


def check_linear(node) -> Optional[str]:
    args = bind(node)
    return _check(args.weight, dtype_of(args.input))


def rewrite_linear(graph: fx.Graph, node: fx.Node) -> fx.Node:
    args = bind(node)
    (qdata, scale, zero_point), (group_size, bits) = _parts(args.weight)
    return graph.call_function(
        torch.ops.etmlx.quantized_linear.default, (args.input, qdata, scale, zero_point, args.bias, group_size, bits)
    )


def check_embedding(node) -> Optional[str]:
    """(``padding_idx`` and the rest only change gradients: the lookup is the same.)"""
    weight = bind(node).weight
    return _check(weight, bind(weight).output_dtype)


def _take(graph: fx.Graph, op, dequantize: fx.Node, indices: fx.Node) -> fx.Node:
    """``op`` (a quantized lookup: rows, or matrices of a stack) of ``dequantize``'s parts."""
    (qdata, scale, zero_point), (group_size, bits) = _parts(dequantize)
    return graph.call_function(op, (qdata, scale, zero_point, indices, group_size, bits))


def rewrite_embedding(graph: fx.Graph, node: fx.Node) -> fx.Node:
    args = bind(node)
    return _take(graph, torch.ops.etmlx.quantized_embedding.default, args.weight, args.indices)


def reads_dequantized_stack(node) -> bool:
    """Whether an ``x[ids]`` call picks matrices of a ``dequantize_affine`` stack (a
    mixture of experts' quantized expert weights, ``etmlx.quant.weights``)."""
    args = bind(node)
    stack = _dequantized(args.self)
    return stack is not None and example_of(stack).dim() == 3 and len(args.indices) == 1 and args.indices[0] is not None


def check_stack_take(node) -> Optional[str]:
    stack = bind(node).self
    return _check(stack, bind(stack).output_dtype)


def rewrite_stack_take(graph: fx.Graph, node: fx.Node) -> fx.Node:
    args = bind(node)
    return _take(graph, torch.ops.etmlx.quantized_stack_take.default, args.self, args.indices[0])
