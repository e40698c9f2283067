"""Which blocks of a model tensor parallelism splits, found from its traced graph
(``torch.export``), whatever the layers are named.

- Attention: each ``scaled_dot_product_attention`` call, and each ``matmul -> softmax ->
  matmul`` written out by hand. Its query, key and value operands are traced back to the
  ``nn.Linear`` that projects each (one for all three: a stacked qkv projection), its
  output forward to the ``nn.Linear`` that consumes it; the head counts come from the
  operands' shapes.
- MLP: an ``nn.Linear`` (down) whose input is one or two other ``nn.Linear``s (up, gate)
  through elementwise operations only (activations, the gate's product).

A block found here is sharded by ``etmlx/parallel/sharding.py``; ``etmlx/parallel/shard_check.py`` then runs
the ranks' programs together against the whole model, so a layout this reading does not
see (heads stored other than head-major) is an error at export, never a wrong output.
"""

from dataclasses import dataclass, field

import torch

aten = torch.ops.aten

_SOFTMAX = (aten.softmax.int, aten._softmax.default, aten._safe_softmax.default)
# What an MLP may compute between its up/gate projections and its down projection.
_ELEMENTWISE = {
    aten.gelu.default, aten.silu.default, aten.relu.default, aten.sigmoid.default, aten.tanh.default,
    aten.mul.Tensor, aten.mul.Scalar, aten.dropout.default, aten.clone.default, aten.alias.default,
    aten._to_copy.default, aten.to.dtype, aten.gelu_.default, aten.silu_.default, aten.relu_.default,
    aten.hardswish.default, aten.elu.default, aten.leaky_relu.default, aten.pow.Tensor_Scalar,
    aten.contiguous.default, aten.detach.default,
}


@dataclass
class Attention:
    """One attention call and the projections around it (module paths in the model)."""

    module: str  # the module that owns the call, for the decision line
    position: int = 0  # of the call in the graph: blocks are listed in the model's order
    q: str = ""
    k: str = ""
    v: str = ""  # equal to q and k for a stacked qkv projection
    out: str = ""
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    value_dim: int = 0
    problem: str = ""  # why it cannot be sharded, if it cannot

    @property
    def stacked(self) -> bool:
        return self.q == self.k == self.v


@dataclass
class Mlp:
    module: str
    position: int = 0  # of the down projection in the graph
    ups: tuple = ()  # the up and gate projections
    down: str = ""
    hidden: int = 0


@dataclass
class ShardPlan:
    attention: list = field(default_factory=list)
    mlps: list = field(default_factory=list)

    @property
    def blocks(self) -> list:
        return sorted(self.attention + self.mlps, key=lambda block: block.position)


def find_blocks(model: torch.nn.Module, program) -> ShardPlan:
    """The attention and MLP blocks of ``model`` in ``program``, an ExportedProgram traced
    from it (or from a module that holds it: parameters are matched by identity)."""
    linears = _linear_calls(model, program)
    plan = ShardPlan()
    position = {node: index for index, node in enumerate(program.graph.nodes)}
    for node in program.graph.nodes:
        operands = _attention_operands(node)
        if operands is not None:
            plan.attention.append(_attention(node, operands, linears, model))
            plan.attention[-1].position = position[node]
    taken = {name for a in plan.attention if not a.problem for name in (a.q, a.k, a.v, a.out)}
    for node, name in linears.items():
        if name not in taken:
            mlp = _mlp(node, name, linears, taken)
            if mlp is not None:
                mlp.position = position[node]
                plan.mlps.append(mlp)
                taken |= {*mlp.ups, mlp.down}
    return plan


def _linear_calls(model, program) -> dict:
    """``aten.linear`` node -> path of the ``nn.Linear`` of ``model`` whose weight it reads."""
    by_tensor = {id(p): name.rpartition(".")[0] for name, p in model.named_parameters() if name.endswith("weight")}
    parameters = program.graph_signature.inputs_to_parameters
    calls = {}
    for node in program.graph.nodes:
        if node.target is not aten.linear.default or not isinstance(node.args[1], torch.fx.Node):
            continue
        fqn = parameters.get(node.args[1].name)
        path = by_tensor.get(id(program.state_dict.get(fqn))) if fqn else None
        if path is not None and isinstance(model.get_submodule(path), torch.nn.Linear):
            calls[node] = path
    return calls


def _attention_operands(node):
    """(q, k, v, output) of an attention call at ``node``, else None."""
    if node.op != "call_function":
        return None
    if node.target is aten.scaled_dot_product_attention.default:
        q, k, v = node.args[:3]
        return q, k, v, node
    if node.target in _SOFTMAX:
        scores = _upstream(node.args[0], aten.matmul.default)
        weighted = [u for u in node.users if u.target is aten.matmul.default and u.args[0] is node]
        if scores is not None and len(weighted) == 1:
            return scores.args[0], scores.args[1], weighted[0].args[1], weighted[0]
    return None


def _upstream(node, target, hops: int = 4):
    """The nearest ``target`` call above ``node`` along first operands (scaling, masking)."""
    for _ in range(hops):
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            return None
        if node.target is target:
            return node
        node = node.args[0]
    return None


def _owner(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def _attention(node, operands, linears, model) -> Attention:
    q, k, v, output = operands
    found = Attention(module=_owner(node))
    sources = [_projections(x, linears, upstream=True) for x in (q, k, v)]
    consumers = _projections(output, linears, upstream=False)
    if not all(len(s) == 1 for s in sources) or len(consumers) != 1:
        found.problem = "its query, key, value and output are not each one nn.Linear projection"
        return found
    (found.q,), (found.k,), (found.v,), (found.out,) = sources + [consumers]
    found.module = _common_prefix([found.q, found.k, found.v, found.out])
    if len({found.q, found.k, found.v}) == 2:
        found.problem = "two of query, key and value share a projection (only all three stacked is split)"
        return found
    shape_q, shape_k, shape_v = (x.meta["val"].shape for x in (q, k, v))
    if not len(shape_q) == len(shape_k) == len(shape_v) == 4:
        found.problem = f"attention over rank-{len(shape_q)} operands, not (batch, heads, sequence, head_dim)"
        return found
    found.heads, found.head_dim, found.value_dim = int(shape_q[1]), int(shape_q[-1]), int(shape_v[-1])
    width = {name: model.get_submodule(name).out_features for name in (found.q, found.k, found.v)}
    if found.stacked:
        kv_width = width[found.q] - found.heads * found.head_dim
        found.kv_heads = max(kv_width, 0) // (found.head_dim + found.value_dim)
        consistent = found.kv_heads > 0 and found.kv_heads * (found.head_dim + found.value_dim) == kv_width
    else:
        found.kv_heads = width[found.k] // found.head_dim
        consistent = (width[found.q] == found.heads * found.head_dim and found.kv_heads * found.head_dim == width[found.k]
                      and width[found.v] == found.kv_heads * found.value_dim)
    if not consistent:
        found.problem = "its projections' widths do not match its heads"
    return found


def _projections(start, linears, upstream: bool) -> set:
    """The nn.Linear calls reached from ``start`` (its operands when ``upstream``, else its
    users), not looking past the first one on each path."""
    seen, found, todo = set(), set(), [start]
    while todo:
        node = todo.pop()
        if not isinstance(node, torch.fx.Node) or node in seen:
            continue
        seen.add(node)
        if node in linears and node is not start:
            found.add(linears[node])
            continue
        todo.extend(node.all_input_nodes if upstream else node.users)
    return found


def _mlp(down, name, linears, taken):
    """The MLP whose down projection is ``down``, else None."""
    width = down.args[0].meta["val"].shape[-1]
    ups, todo, seen = set(), [down.args[0]], set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in linears:
            if linears[node] in taken or node.meta["val"].shape[-1] != width:
                return None
            ups.add(linears[node])
        elif node.op == "call_function" and node.target in _ELEMENTWISE:
            todo.extend(node.all_input_nodes)
        else:
            return None  # a residual, a norm, an input: not an MLP's hidden layer
    if not 1 <= len(ups) <= 2:
        return None
    return Mlp(module=_common_prefix([name, *ups]), ups=tuple(sorted(ups)), down=name, hidden=int(width))


def _common_prefix(paths: list) -> str:
    parts = [p.split(".") for p in paths]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)
