"""Lowering rules: for each operator, a ``check`` and a ``lower`` side by side.

The partitioner claims a node only if ``check_node`` returns ``None``; preprocess
then calls the rule's ``lower``, which may assume everything ``check`` verified.
One function decides support, so the partitioner and lowering cannot disagree.
"""

import operator
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import fx

from .arguments import BoundArguments, bind
from .dtypes import check_dtype

Check = Callable[[fx.Node, BoundArguments], Optional[str]]


@dataclass(frozen=True)
class Rule:
    """Both halves read the call's arguments bound by name (``lowering/arguments.py``)."""

    check: Check
    lower: Callable  # (LoweringContext, fx.Node, BoundArguments) -> None
    # Its constant operands are repacked at export into dtypes MLX holds (quantized
    # weights of float8 values, say), so theirs need not be: the rule's check decides.
    repacks_constants: bool = False


RULES: dict = {}


def accept(node: fx.Node, args: BoundArguments) -> Optional[str]:
    return None


def lowers(*names: str, check: Check = accept, repacks_constants: bool = False):
    """Registers the decorated ``lower(ctx, node, args)`` for operators ``names``."""

    def register(lower):
        for name in names:
            if name in RULES:
                raise RuntimeError(f"two lowering rules for {name}")
            RULES[name] = Rule(check, lower, repacks_constants)
        return lower

    return register


def op_name(target) -> str:
    """``aten::add.Tensor`` for ATen/edge operators, ``_operator.mul`` for Python ones."""
    if hasattr(target, "name") and callable(target.name):
        return target.name()
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', target)}"


def is_call(node, *names) -> bool:
    """Whether ``node`` is a call of one of the operators ``names`` (``op_name`` form)."""
    return isinstance(node, fx.Node) and node.op == "call_function" and op_name(node.target) in names


def values_of(node: fx.Node):
    """The example values (fake tensors, SymInts) a node produces."""
    value = node.meta.get("val")
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_node(node: fx.Node) -> Optional[str]:
    """``None`` when MLX can compute ``node`` exactly; otherwise why not."""
    name = op_name(node.target)
    rule = RULES.get(name)
    if rule is None:
        return f"no MLX lowering for {name}"
    tensors = [a for a in node.all_input_nodes if not (rule.repacks_constants and is_frozen_placeholder(a))] + [node]
    for source in tensors:
        for value in values_of(source):
            if isinstance(value, torch.Tensor):
                reason = check_dtype(value.dtype)
                if reason:
                    return reason
    return rule.check(node, bind(node))


FROZEN = "etmlx_frozen"


def mark_frozen_placeholders(program) -> None:
    """Flags the placeholders whose values are fixed at export (weights, frozen buffers,
    lifted constants), so checks can tell a constant operand from a run-time input."""
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    fixed = {
        name
        for name, target in {
            **signature.inputs_to_parameters,
            **signature.inputs_to_buffers,
            **signature.inputs_to_lifted_tensor_constants,
        }.items()
        if target not in mutated
    }
    for node in program.graph.nodes:
        if node.op == "placeholder":
            node.meta[FROZEN] = node.name in fixed


def is_frozen_placeholder(node) -> bool:
    """A weight, frozen buffer or lifted constant: fixed at export, before any rule ran.
    (``LoweringContext.is_constant`` also knows the values rules fold at lowering.)"""
    return isinstance(node, fx.Node) and node.meta.get(FROZEN, False)


def rule_for(node: fx.Node) -> Rule:
    return RULES[op_name(node.target)]


def getitem_source(node: fx.Node):
    """The multi-output node a ``getitem`` reads, or None for other nodes."""
    if node.op == "call_function" and node.target is operator.getitem:
        return node.args[0]
    return None
