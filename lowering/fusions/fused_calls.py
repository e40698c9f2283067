"""Per-call retargeting of fused ops, before decomposition.

ExecuTorch's ``ops_to_not_decompose`` keeps an operator whole for every call once any
call is claimed, and its per-node filter breaks ordinary attention blocks
(docs/architecture.md, "ExecuTorch traps").
Instead each call that MLX accepts is rewritten to an ``etmlx::`` custom op, which no
decomposition touches; declined calls stay aten and decompose into primitives that
MLX claims one by one. The acceptance test is the lowering rule's own check.
"""

import math
import operator
from dataclasses import dataclass
from typing import Callable

import torch
from torch import fx

import etmlx.lowering.custom_ops  # noqa: F401  (registers torch.ops.etmlx.*)
from etmlx.lowering.arguments import bind
from etmlx.lowering.dtypes import check_dtype
from etmlx.lowering.registry import mark_frozen_placeholders
from etmlx.lowering.rules.attention import check_roll, check_sdpa
from etmlx.lowering.rules.scan import check_sortable

from . import quantized_weights

aten = torch.ops.aten


def _always(node) -> bool:
    return True


@dataclass(frozen=True)
class FusedOp:
    aten_op: object
    check: Callable  # (node) -> None when MLX takes the call, else why not
    rewrite: Callable  # (graph, node) -> new node computing the same value
    applies: Callable = _always  # (node) -> whether the call is this fusion's at all


def _val(arg):
    return arg.meta["val"] if isinstance(arg, fx.Node) else arg


def _unrepeated(node: fx.Node):
    """The k/v tensor before a head repeat (``repeat_interleave`` on dim 1, or
    Hugging Face's ``repeat_kv``: unsqueeze(2) -> expand -> reshape), else None.
    Only called at rank 4, the one rank where dim 1 is the head dim. Both forms
    repeat each head in place ([h0, h0, h1, h1]), which is grouped-query attention's
    grouping; the shapes are checked so that no other reshape is mistaken for one."""
    if node.target == aten.repeat_interleave.self_int:
        repeat = bind(node)
        return repeat.self if repeat.dim in (1, -3) else None
    if node.target not in (aten.reshape.default, aten.view.default, aten._unsafe_view.default):
        return None
    expand = bind(node).self
    if not (isinstance(expand, fx.Node) and expand.target == aten.expand.default):
        return None
    unsqueeze = bind(expand).self
    if not (isinstance(unsqueeze, fx.Node) and unsqueeze.target == aten.unsqueeze.default):
        return None
    if bind(unsqueeze).dim not in (2, -3):
        return None
    source = bind(unsqueeze).self
    batch, heads, length, dim = _val(source).shape
    repeats = _val(expand).shape[2]
    if tuple(_val(expand).shape) != (batch, heads, repeats, length, dim):
        return None
    if tuple(_val(node).shape) != (batch, heads * repeats, length, dim):
        return None
    return source


def _absorbed_repeats(args):
    """k and v without their head repeat, when both carry the same absorbable one."""
    q, k, v = args.query, args.key, args.value
    if _val(q).dim() != 4 or not all(isinstance(t, fx.Node) for t in (k, v)):
        return k, v
    k_src, v_src = _unrepeated(k), _unrepeated(v)
    if k_src is None or v_src is None or _val(k_src).shape[1] != _val(v_src).shape[1]:
        return k, v
    return k_src, v_src


def _check_sdpa_call(node):
    a = bind(node)
    k, v = _absorbed_repeats(a)
    return check_sdpa(
        _val(a.query), _val(k), _val(v), _val(a.attn_mask), a.dropout_p, a.is_causal, a.enable_gqa or k is not a.key
    )


def _sdpa_rewrite(graph: fx.Graph, node: fx.Node) -> fx.Node:
    a = bind(node)
    k, v = _absorbed_repeats(a)
    scale = a.scale if a.scale is not None else 1.0 / math.sqrt(_val(a.query).shape[-1])
    return graph.call_function(
        torch.ops.etmlx.sdpa.default, (a.query, k, v, a.attn_mask, bool(a.is_causal), float(scale))
    )


def _roll_args(node):
    args = bind(node)
    shifts, dims = args.shifts, args.dims
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    return args.self, shifts, dims


def _check_roll_call(node):
    x, shifts, dims = _roll_args(node)
    return check_dtype(_val(x).dtype) or check_roll(_val(x), shifts, dims)


def _roll_rewrite(graph, node):
    return graph.call_function(torch.ops.etmlx.roll.default, _roll_args(node))


def _check_stable_sort(node):
    """``torch.sort(x, stable=True)`` is not core ATen, so ExecuTorch refuses it; MLX's
    sort is stable (ties keep their order, as ``rules/scan.py`` lowers every sort)."""
    return check_dtype(_val(bind(node).self).dtype) or check_sortable(node, bind(node))


def _stable_sort_rewrite(graph, node):
    args = bind(node)
    return graph.call_function(aten.sort.default, (args.self, args.dim, args.descending))


def _stable_argsort_rewrite(graph, node):
    return graph.call_function(operator.getitem, (_stable_sort_rewrite(graph, node), 1))


FUSED_OPS = [
    FusedOp(aten.scaled_dot_product_attention.default, _check_sdpa_call, _sdpa_rewrite),
    FusedOp(aten.roll.default, _check_roll_call, _roll_rewrite),
    FusedOp(aten.sort.stable, _check_stable_sort, _stable_sort_rewrite),
    FusedOp(aten.argsort.stable, _check_stable_sort, _stable_argsort_rewrite),
    FusedOp(aten.linear.default, quantized_weights.check_linear, quantized_weights.rewrite_linear,
            quantized_weights.reads_dequantized_weight),
    FusedOp(aten.embedding.default, quantized_weights.check_embedding, quantized_weights.rewrite_embedding,
            quantized_weights.reads_dequantized_weight),
    FusedOp(aten.index.Tensor, quantized_weights.check_stack_take, quantized_weights.rewrite_stack_take,
            quantized_weights.reads_dequantized_stack),
]


def retarget_fused_calls(program, record_decomposed: Callable):
    """Rewrites, in place, each accepted call of a fused op; hands each declined one to
    ``record_decomposed(operator, node_name, reason)`` (the partitioner's report)."""
    graph = program.graph_module.graph
    mark_frozen_placeholders(program)
    by_target = {op.aten_op: op for op in FUSED_OPS}
    changed = False
    for node in list(graph.nodes):
        fused = by_target.get(node.target) if node.op == "call_function" else None
        if fused is None or not fused.applies(node):
            continue
        reason = fused.check(node)
        if reason is not None:
            record_decomposed(node.target.name(), node.name, reason)
            continue
        with graph.inserting_before(node):
            replacement = fused.rewrite(graph, node)
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        changed = True
    if changed:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return program
