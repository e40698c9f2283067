"""The custom ops of ExecuTorch's own MLX delegate (``mlx::``, backends/mlx/custom_ops.py
in ExecuTorch's sources), which models prepared for that delegate call, rewritten
before decomposition into the ATen computation each stands for, which etmlx lowers as
it lowers any model (the attention as one ``etmlx::sdpa`` where MLX's kernel takes it).

What each computes is the upstream op's documented meaning: ``kv_cache_update`` writes
``new_values`` into the cache at ``start_pos`` (modulo ``ring_size`` when it is a ring
buffer), a mutation the rewrite makes with ATen's own ``index_copy_``, so that
functionalization turns it into a buffer update the delegate owns; ``custom_sdpa``
attends over the cache's first ``start_pos + L`` positions, causally aligned to the end;
``rope`` rotates the first ``dims`` features by angles ``(pos + t) * base^(-2i/dims) *
scale``; ``gather_mm`` multiplies by the right operands ``rhs_indices`` picks;
``gather_qmm`` stays as it is, for its own rule (``rules/delegate_quantized.py``);
``moe_gather_inputs`` repeats each token's row for its ``top_k`` experts, ordered by
expert, and ``moe_scatter_outputs`` puts the experts' outputs back in token order;
``sample`` draws a token by Gumbel-max, its noise from ``etmlx::random_uniform`` keyed by
the call's seed; ``gated_delta_rule`` (its custom-kernel module) runs Qwen3.5's recurrence
from ``state`` and writes the final state back into it: ``etmlx::gated_delta`` and a copy. A program whose decompositions already ran holds ``kv_cache_update`` and
``gated_delta_rule`` as ``auto_functionalized_v2`` calls, rewritten into the functional
computation of the new value, which the program's outputs write back to the buffer. A call etmlx cannot compute as that
meaning says is refused with the reason, and an ``mlx::`` op it does not know (a custom
Metal kernel, say) by name, as is ExecuTorch's off-graph ``kvcache::update_and_attend``:
no ExecuTorch kernel could run either.
"""

from typing import Callable, Optional

import torch
from torch import fx
from torch.fx.proxy import GraphAppendingTracer, Proxy

import etmlx.lowering.custom_ops  # noqa: F401  (registers torch.ops.etmlx.*)
from etmlx.errors import ExportError
from etmlx.lowering.arguments import bind, bind_functionalized
from etmlx.lowering.registry import mark_frozen_placeholders
from etmlx.lowering.rules.attention import check_sdpa
from etmlx.lowering.rules.common import example_of
from etmlx.lowering.rules.delegate_quantized import check_gather_qmm

aten = torch.ops.aten
NAMESPACE = "mlx"


def _range(like, start, length, dtype):
    """``start, start + 1, ..., start + length - 1`` in ``dtype``: an ``arange`` when a
    bound is symbolic; else made from ``like`` (a proxy), since a tensor the rewrite made
    itself could not be recorded into the graph."""
    if isinstance(start, Proxy) or isinstance(length, Proxy):
        return aten.arange.start_step(start, start + length, dtype=dtype)
    counts = aten.cumsum.default(aten.new_ones.default(like, [length], dtype=dtype), 0)
    return aten.add.Scalar(counts, start - 1)


def _cache_slots(args):
    slots = _range(args.new_values, args.start_pos, aten.sym_size.int(args.new_values, 2), torch.int64)
    return aten.remainder.Scalar(slots, args.ring_size) if args.ring_size else slots


def _kv_cache_update(args):
    """An ``index_copy_`` of the new positions' slots, as transformers' static cache
    writes: etmlx keeps the cache in the delegate and checks the slots in range."""
    aten.index_copy_.default(args.cache, 2, _cache_slots(args), args.new_values)
    return aten.new_zeros.default(args.new_values, [1])  # the upstream op's placeholder result


def _functionalized_kv_cache_update(args):
    """The same write in a functionalized program: the op's result and the cache's new
    value, which the program's outputs write back to the buffer."""
    updated = aten.index_copy.default(args.cache, 2, _cache_slots(args), args.new_values)
    return aten.new_zeros.default(args.new_values, [1]), updated


def _gated_delta_rule(args):
    """``etmlx::gated_delta`` (the same rule, state layout and linear-space decay), its
    final state written back over ``state`` as the upstream op mutates it."""
    output, state = _functionalized_gated_delta_rule(args)
    aten.copy_.default(args.state, state)
    return output


def _functionalized_gated_delta_rule(args):
    """The rule's output and the state's new value, which the program's outputs write back."""
    result = torch.ops.etmlx.gated_delta.default(args.q, args.k, args.v, args.g, args.beta, args.state)
    return result[0], result[1]


def _causal_mask(query, stop):
    """``[L, stop]`` booleans: query row i (position ``stop - L + i``) sees positions up
    to its own, the causal mask aligned to the end of the keys."""
    length = aten.sym_size.int(query, 2)
    columns = _range(query, 0, stop, torch.int64)
    positions = _range(query, stop - length, length, torch.int64)
    return aten.le.Tensor(aten.unsqueeze.default(columns, 0), aten.unsqueeze.default(positions, 1))


def _check_custom_sdpa(node, args) -> Optional[str]:
    if args.dropout_p:
        return f"attention dropout {args.dropout_p} (inference computes none)"
    return None


def _custom_sdpa(args, node):
    """One ``etmlx::sdpa`` where MLX's kernel takes the call (its check, on the traced
    query and the whole cache), else ATen's attention, which decomposes."""
    query = args.query
    stop = args.start_pos + aten.sym_size.int(query, 2)
    key = aten.slice.Tensor(args.key, 2, 0, stop)
    value = aten.slice.Tensor(args.value, 2, 0, stop)
    # A causal call ignores any mask it is given, as the upstream op does.
    mask = _causal_mask(query, stop) if args.is_causal else args.attn_mask
    traced = bind(node)
    q, k, v = example_of(traced.query), example_of(traced.key), example_of(traced.value)
    scale = float(args.scale if args.scale is not None else q.shape[-1] ** -0.5)
    grouped = k.shape[1] != q.shape[1]
    mask_value = torch.empty(q.shape[2], k.shape[2], dtype=torch.bool, device="meta") if args.is_causal \
        else example_of(traced.attn_mask)
    if check_sdpa(q, k, v, mask_value, 0.0, False, grouped) is None:
        return torch.ops.etmlx.sdpa.default(query, key, value, mask, False, scale)
    return aten.scaled_dot_product_attention.default(query, key, value, mask, scale=scale, enable_gqa=grouped)


def _check_rope(node, args) -> Optional[str]:
    x = example_of(args.x)
    if args.dims % 2 or not 0 < args.dims <= x.shape[-1]:
        return f"rotating {args.dims} of {x.shape[-1]} features (an even count, at most all of them)"
    if args.freqs is not None and example_of(args.freqs).dim() != 1:
        return "per-position angles (2-d freqs)"
    return None


def _rope(args, node):
    x, dims, half = args.x, args.dims, args.dims // 2
    steps = _range(x, 0, half, torch.float32)
    if args.freqs is None:
        inverse = aten.pow.Scalar(float(args.base), aten.div.Scalar(aten.mul.Scalar(steps, -2.0), float(dims)))
    else:
        inverse = aten.reciprocal.default(aten._to_copy.default(args.freqs, dtype=torch.float32))
    length = aten.sym_size.int(x, 2)
    positions = _range(x, args.pos, length, torch.float32)
    angles = aten.mul.Scalar(aten.mul.Tensor(aten.unsqueeze.default(positions, 1), inverse), float(args.scale))
    dtype = example_of(node.args[0]).dtype
    cos = aten._to_copy.default(aten.cos.default(angles), dtype=dtype)
    sin = aten._to_copy.default(aten.sin.default(angles), dtype=dtype)
    rotated = aten.slice.Tensor(x, -1, 0, dims)
    if args.traditional:
        first, second = aten.slice.Tensor(rotated, -1, 0, dims, 2), aten.slice.Tensor(rotated, -1, 1, dims, 2)
    else:
        first, second = aten.slice.Tensor(rotated, -1, 0, half), aten.slice.Tensor(rotated, -1, half, dims)
    real = aten.sub.Tensor(aten.mul.Tensor(first, cos), aten.mul.Tensor(second, sin))
    imaginary = aten.add.Tensor(aten.mul.Tensor(first, sin), aten.mul.Tensor(second, cos))
    if args.traditional:
        pairs = aten.stack.default([real, imaginary], -1)
        out = aten.flatten.using_ints(pairs, -2)
    else:
        out = aten.cat.default([real, imaginary], -1)
    if dims < example_of(node.args[0]).shape[-1]:
        out = aten.cat.default([out, aten.slice.Tensor(x, -1, dims)], -1)
    return out


def _check_gather_mm(node, args) -> Optional[str]:
    if args.lhs_indices is not None:
        return "lhs_indices (the upstream op's reference gathers the right operand only)"
    return None


def _gather_mm(args, node):
    """``a @ b[rhs_indices]``: the gather and batched matmul etmlx's fusion turns into
    ``mx.gather_mm``."""
    chosen = args.b if args.rhs_indices is None else aten.index.Tensor(args.b, [args.rhs_indices])
    traced = bind(node)
    per_token = traced.rhs_indices is not None and example_of(traced.a).dim() == 3 and example_of(traced.rhs_indices).dim() == 1
    return aten.bmm.default(args.a, chosen) if per_token else aten.matmul.default(args.a, chosen)


def _argsort(values):
    """Ascending order (ties lowest index first, as etmlx sorts; the callers need only a
    permutation)."""
    return aten.sort.default(values)[1]


def _moe_gather_inputs(args, node):
    """Each token's row once per expert it chose, ordered by expert (upstream's sorted
    branch, taken for every token count: the order is a permutation the scatter undoes,
    so the numerics are those of either branch), with the experts' ids, a 1 saying they
    are sorted, and the inverse permutation."""
    flat = aten.reshape.default(args.expert_indices, [-1])
    order = _argsort(flat)
    rows = aten.div.Scalar_mode(order, args.top_k, rounding_mode="floor")
    x_input = aten.unsqueeze.default(aten.index.Tensor(args.x, [rows]), -2)
    idx = aten._to_copy.default(aten.index.Tensor(flat, [order]), dtype=torch.int32)
    inverse = aten._to_copy.default(_argsort(order), dtype=torch.int32)
    sorted_flag = aten.new_ones.default(flat, [], dtype=torch.int32)
    return x_input, idx, sorted_flag, inverse


def _moe_scatter_outputs(args, node):
    """Back in token order (``inv_order`` is the identity where the gather did not sort,
    so it is applied either way), ``[tokens, top_k, H]``."""
    down = aten.squeeze.dim(args.down, -2)
    restored = aten.index.Tensor(down, [aten._to_copy.default(args.inv_order, dtype=torch.int64)])
    return aten.reshape.default(restored, [-1, args.top_k, aten.sym_size.int(down, -1)])


def _check_sample(node, args) -> Optional[str]:
    if args.seed is None:
        return ("no seed: unseeded, the upstream op draws from MLX's global generator, whose state a compiled "
                "graph would freeze (export with a seed, a 0-d integer tensor input)")
    logits = example_of(args.logits)
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        return f"logits of shape {tuple(logits.shape)} and dtype {logits.dtype} (floating-point [batch, vocab])"
    return None


def _sample(args, node):
    """Gumbel-max, as the upstream op computes it, all in float32: the logits over the
    temperature, filtered by top-k and then top-p (over what top-k kept), plus
    ``-log(-log(u))``, ``u`` drawn by MLX's generator keyed by the seed; the argmax of
    that. Where the temperature is not positive, the argmax of the logits: the sampling
    chain is computed and dropped there (the upstream delegate branches), so its index
    check stops only a sampled call (a ``top_k`` below 1)."""
    logits = args.logits
    sampling = aten.gt.Scalar(args.temperature, 0)
    scaled = aten.div.Tensor(aten._to_copy.default(logits, dtype=torch.float32), args.temperature)
    vocab = example_of(node.args[0]).shape[-1]
    descending = aten.sort.default(scaled, -1, True)[0]
    kth = aten.where.self(sampling, aten.sub.Scalar(aten.clamp.default(args.top_k, None, vocab), 1),
                          aten.zeros_like.default(args.top_k))
    threshold = aten.index_select.default(descending, -1, aten.reshape.default(kth, [1]))
    scaled = aten.where.ScalarOther(aten.ge.Tensor(scaled, threshold), scaled, float("-inf"))
    probs = aten._softmax.default(scaled, -1, False)
    sorted_probs = aten.sort.default(probs, -1, True)[0]
    kept = aten.le.Tensor(aten.sub.Tensor(aten.cumsum.default(sorted_probs, -1), sorted_probs), args.top_p)
    smallest = aten.amin.default(aten.where.ScalarOther(kept, sorted_probs, float("inf")), [-1], True)
    scaled = aten.where.ScalarOther(aten.ge.Tensor(probs, smallest), scaled, float("-inf"))
    shape = [aten.sym_size.int(logits, 0), vocab]
    noise = torch.ops.etmlx.random_uniform.default(args.seed, shape)
    gumbel = aten.neg.default(aten.log.default(aten.neg.default(aten.log.default(noise))))
    sampled = aten.argmax.default(aten.add.Tensor(scaled, gumbel), -1)
    return aten.where.self(sampling, sampled, aten.argmax.default(logits, -1))


# op name -> (check(node, args) -> reason or None, expand(args, node) -> result proxy, or a tuple of them)
_EXPANSIONS: dict = {
    "kv_cache_update": (lambda node, args: None, lambda args, node: _kv_cache_update(args)),
    "gated_delta_rule": (lambda node, args: None, lambda args, node: _gated_delta_rule(args)),
    "custom_sdpa": (_check_custom_sdpa, _custom_sdpa),
    "rope": (_check_rope, _rope),
    "gather_mm": (_check_gather_mm, _gather_mm),
    "moe_gather_inputs": (lambda node, args: None, _moe_gather_inputs),
    "moe_scatter_outputs": (lambda node, args: None, _moe_scatter_outputs),
    "sample": (_check_sample, _sample),
}


# op name -> its lowering rule's check: lowered as it is, after decomposition
_LOWERED_AS_IS = {"gather_qmm": check_gather_qmm}

# The mutating ops, as ``auto_functionalized_v2`` calls them in a program whose
# decompositions ran before etmlx saw it (``run_decompositions``): op name -> expansion.
_FUNCTIONALIZED = {"kv_cache_update": _functionalized_kv_cache_update,
                   "gated_delta_rule": _functionalized_gated_delta_rule}


def _op_name(op) -> str:
    return op._schema.name.split("::")[-1]


def is_delegate_op(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "namespace", None) == NAMESPACE


# ExecuTorch's off-graph cache op (extension/llm/cache), which the upstream delegate lowers
# onto a cache its runtime owns and sizes outside the program: op -> why etmlx cannot.
_OFF_GRAPH = {
    "kvcache::update_and_attend": "attention over an off-graph KV cache, which the runtime running the "
    "program owns and sizes outside it; etmlx keeps a cache inside the delegate: write the attention with "
    "mlx::kv_cache_update and mlx::custom_sdpa, or export a transformers model with etmlx export-llm",
}


def _functionalized_delegate_op(node: fx.Node):
    """The ``mlx::`` op an ``auto_functionalized_v2`` node calls, or None."""
    if node.op != "call_function" or node.target is not torch.ops.higher_order.auto_functionalized_v2:
        return None
    return node.args[0] if getattr(node.args[0], "namespace", None) == NAMESPACE else None


def expand_delegate_ops(program) -> bool:
    """Rewrites, in place, every ``mlx::`` call of ``program``'s graph into ATen ops;
    raises ExportError for one etmlx cannot compute. Returns whether any was found."""
    graph = program.graph_module.graph
    mark_frozen_placeholders(program)  # gather_qmm's check needs its weights fixed
    found = False
    for node in list(graph.nodes):
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is not None and schema.name in _OFF_GRAPH:
            raise ExportError(f"{schema.name} ({node.name}): {_OFF_GRAPH[schema.name]}")
        functionalized = _functionalized_delegate_op(node)
        if functionalized is not None:
            found = True
            _expand_functionalized(program, node, _op_name(functionalized))
            continue
        if not is_delegate_op(node):
            continue
        found = True
        name = _op_name(node.target)
        if name not in _EXPANSIONS and name not in _LOWERED_AS_IS:
            raise ExportError(f"mlx::{name} ({node.name}): {_unknown(name)}")
        check, expand = _EXPANSIONS.get(name, (_LOWERED_AS_IS.get(name), None))
        reason = check(node, bind(node))
        if reason:
            raise ExportError(f"mlx::{name} ({node.name}): {reason}")
        if expand is not None:
            _replace(graph, node, lambda args: expand(args, node), bind(node))
    if found:
        graph.eliminate_dead_code()
        program.graph_module.recompile()
    return found


def _unknown(name: str) -> str:
    known = ", mlx::".join([*_EXPANSIONS, *_LOWERED_AS_IS])
    return f"etmlx has no lowering for this op of ExecuTorch's MLX delegate (it lowers mlx::{known})"


def _expand_functionalized(program, node: fx.Node, name: str) -> None:
    """An ``auto_functionalized_v2`` call of a mutating ``mlx::`` op, rewritten into the
    functional ATen computation of the new value of each tensor it mutates; the program's
    outputs that wrote those values back to their buffers name the new nodes."""
    if name not in _FUNCTIONALIZED:  # every mutating op etmlx lowers is there
        raise ExportError(f"mlx::{name} ({node.name}): {_unknown(name)}")
    try:
        bound = bind_functionalized(node)
    except ValueError as error:
        raise ExportError(f"mlx::{name} ({node.name}): {error}") from None
    renamed = _replace(program.graph_module.graph, node, _FUNCTIONALIZED[name], bound)
    for spec in program.graph_signature.output_specs:
        if getattr(spec.arg, "name", None) in renamed:
            spec.arg.name = renamed[spec.arg.name]


def _replace(graph: fx.Graph, node: fx.Node, expand: Callable, bound) -> dict:
    """``node`` replaced by what ``expand(bound)`` computes, its ATen calls recorded into
    the graph through proxies of the call's tensor and size arguments. Returns, for a
    multi-output op, the name of the node that replaced each of its getitem users."""
    tracer = GraphAppendingTracer(graph)
    proxies = {name: Proxy(value, tracer) if isinstance(value, fx.Node) else value
               for name, value in bound._values.items()}
    before = set(graph.nodes)
    with graph.inserting_before(node):
        result = expand(type(bound)(proxies, bound._op))
    _trace_values([n for n in graph.nodes if n not in before], node)
    renamed = {}
    if isinstance(result, tuple):  # a multi-output op: each getitem of it takes that result
        for user in list(node.users):
            renamed[user.name] = result[user.args[1]].node.name
            user.replace_all_uses_with(result[user.args[1]].node)
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(result.node)
    graph.erase_node(node)
    return renamed


def _trace_values(nodes: list, like: fx.Node) -> None:
    """Each recorded node's traced value (``meta["val"]``), computed in the program's fake
    mode from its operands', as torch.export leaves on every node: the rules and checks
    that run next (another ``mlx::`` op's expansion, the fused calls' checks) read it."""
    from torch._guards import detect_fake_mode

    values = [a.meta["val"] for a in like.all_input_nodes if "val" in a.meta]
    with detect_fake_mode(values):
        for node in nodes:
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
            node.meta["val"] = node.target(*args, **kwargs)
