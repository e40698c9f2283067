"""A model's identical layers traced once: the edge program of a model traced with its
first ``traced`` layers made into the program of all of them, by copying its last layer.

Tracing, decomposing and checking a graph costs time per node; a language model's graph
is its layers over and over (a 1B model: 16 times; 8B: 32). ``etmlx.llm.repeated_layers``
traces the first three and this pass writes the others as copies of the third, whose
inputs are what the second made where the third read what the first made. It is exact
only where each layer computes the same function of its own weights and the layer before
it, so the pass first checks that of the two layers it has: the second and the third are
paired node by node in graph order (the same operator, the same literal arguments, inputs
made inside the layer by paired nodes, from the layer before by nodes that pair in turn,
the layer's own weights and state in the same roles, anything else the same node or an
equal constant). Where any of it fails it says why and leaves the program as it was.

A node belongs to layer i when the module it was traced in is inside that layer, or,
outside every layer, when it reads that layer's own weights or state (the cache
wrapper's per-layer writes) or, without a module, only that layer's nodes."""

import re
from dataclasses import dataclass
from typing import Callable

import torch
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument


@dataclass(frozen=True)
class WholeModel:
    """What the copies read that the short trace did not have: ``layer_path``, the
    layer list's path in the traced module (``cached.model.model.layers``: a weight
    ``{layer_path}.{i}.…`` is layer i's); ``state_layers``, ``{buffer name: layer}`` of
    the whole model's per-layer state (KV caches, recurrent states), each named with
    its layer as the last number (``key_cache_12``); ``tensors``, ``{name: tensor}`` of
    every parameter and buffer of the whole model's traced module."""

    layer_path: str
    state_layers: dict
    tensors: dict

    def layer_of(self, target):
        """The layer whose own weight or state ``target`` names; None for shared ones."""
        if target in self.state_layers:
            return self.state_layers[target]
        found = re.match(rf"{re.escape(self.layer_path)}\.(\d+)\.", target or "")
        return int(found.group(1)) if found else None

    def tensor(self, target: str):
        """The whole model's tensor of ``target``, or None. A weight of a tensor subclass
        (torchao's quantized ones) is named in the edge program by its plain tensors,
        ``….parametrizations.weight.original{i}``, in the order torch's unwrapping takes
        them (``subclass_parametrization.UnwrapTensorSubclass.right_inverse``)."""
        if target in self.tensors:
            return self.tensors[target]
        from torch._functorch._aot_autograd.subclass_parametrization import UnwrapTensorSubclass

        found = re.fullmatch(r"(.*)\.parametrizations\.(\w+)\.original(\d+)", target)
        whole = self.tensors.get(f"{found.group(1)}.{found.group(2)}") if found else None
        if whole is None or type(whole) is torch.Tensor:
            return None
        plain = UnwrapTensorSubclass().right_inverse(whole)  # what torch.export's unwrapping makes
        return plain[int(found.group(3))] if int(found.group(3)) < len(plain) else None

    def renamed(self, target: str, layer: int, other: int) -> str:
        """``target``, layer ``layer``'s, as layer ``other`` names it."""
        if target in self.state_layers:
            return re.sub(rf"(?<!\d){layer}$", str(other), target)
        return target.replace(f"{self.layer_path}.{layer}.", f"{self.layer_path}.{other}.", 1)


@dataclass
class LayersTraced:
    """A method of ``total`` layers traced with its first ``traced`` (``program``, an
    ExportedProgram); ``whole``: what the copies of the last read; ``full()``: the method
    traced whole, for when its layers do not repeat (``etmlx.pipeline.lower_methods``)."""

    program: object
    traced: int
    total: int
    whole: WholeModel
    full: Callable

    def repeat(self, edge_program):
        """Writes the other layers into ``edge_program`` (this method's edge program);
        None when done, else why not (the program untouched)."""
        return repeat_last_layer(edge_program, self.whole, self.traced, self.total)


def repeat_last_layer(program, model: WholeModel, traced: int, total: int):
    """Makes ``program`` (an edge ExportedProgram of layers 0 to ``traced - 1``, traced
    >= 3) the program of ``total`` layers in place; None when done, else why not (the
    program untouched)."""
    pattern = _Pattern.read(program, model, traced)
    if isinstance(pattern, str):
        return pattern
    for layer in range(traced, total):
        for spec, name in zip(pattern.state.values(), pattern.renamed_state(layer)):
            tensor, traced_value = model.tensor(name), _value(program, spec.target)
            if tensor is None:
                return f"the whole model has no {name}"
            if (tensor.dtype, tensor.shape) != (traced_value.dtype, traced_value.shape):
                return f"{name} is not shaped as {spec.target}"
    pattern.write(program, total)
    return None


class _Pattern:
    """The last two traced layers paired node by node (``read``), and copies of the last
    one written into the program (``write``)."""

    def __init__(self, model, traced, last, matcher, state):
        self.model, self.traced, self.last = model, traced, last  # last: its nodes in graph order
        self.pairs = matcher.pairs  # the layer before's node -> the last layer's
        self.state = state  # the last layer's weight and state placeholders -> their InputSpecs

    @classmethod
    def read(cls, program, model, traced):
        specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs
                 if isinstance(spec.arg, TensorArgument) and spec.kind is not InputKind.USER_INPUT}
        owner = {}  # node -> its layer
        for node in program.graph.nodes:
            if node.op == "placeholder":
                layer = model.layer_of(specs[node.name].target) if node.name in specs else None
            else:
                layer = _layer_of(node, model.layer_path, owner) if node.op == "call_function" else None
            if layer is not None:
                owner[node] = layer
        calls = [node for node in program.graph.nodes if node.op == "call_function"]
        layers = sorted({owner[node] for node in calls if node in owner})
        if layers != list(range(traced)):
            return f"the traced layers are {layers}, not 0 to {traced - 1}"
        before = [node for node in calls if owner.get(node) == traced - 2]
        last = [node for node in calls if owner.get(node) == traced - 1]
        if len(before) != len(last):
            return f"layer {traced - 2} has {len(before)} operations and layer {traced - 1} has {len(last)}"
        matcher = _Matcher(program, model, owner, traced, specs)
        for a, b in zip(before, last):
            why = matcher.pair(a, b)
            if why:
                return f"layer {traced - 1}'s {b.name} does not repeat layer {traced - 2}'s {a.name}: {why}"
        why = _escapes(program, before, last) or _updates_of_others(program, model, owner, traced)
        if why:
            return why
        state = {node: specs[node.name] for node in program.graph.nodes
                 if node.op == "placeholder" and owner.get(node) == traced - 1}
        for spec in state.values():  # what the copies will read is what the trace read, for this layer
            if not _same(model.tensor(spec.target), _value(program, spec.target)):
                return f"the whole model's {spec.target} is not the traced one"
        return cls(model, traced, last, matcher, state)

    def renamed_state(self, layer) -> list:
        return [self.model.renamed(spec.target, self.traced - 1, layer) for spec in self.state.values()]

    def write(self, program, total):
        graph = program.graph
        output = graph.output_node()
        last = set(self.last)
        mutations = [(spec, value) for spec, value in zip(program.graph_signature.output_specs, output.args[0])
                     if spec.kind is OutputKind.BUFFER_MUTATION and value in last]
        handles = _DebugHandles(graph)
        after = self.last[-1].next
        tails = {node: (node, spec) for node, spec in self.state.items()}
        previous = {node: node for node in self.last}  # the layer before's copy of each last-layer node
        written = set(self.last)
        added = []  # (OutputSpec, node) of the copies' state updates
        for layer in range(self.traced, total):
            inputs = self._placeholders(program, layer, tails)
            copies = {}
            with graph.inserting_before(after):
                for node in self.last:
                    copies[node] = graph.node_copy(node, lambda arg: self._input(arg, copies, previous, inputs))
                    copies[node].meta = _renamed_meta(node.meta, self.model.layer_path, self.traced - 1, layer, handles)
            added += [(OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(copies[value].name),
                                  self.model.renamed(spec.target, self.traced - 1, layer)), copies[value])
                      for spec, value in mutations]
            previous = copies
            written.update(copies.values())
        for node in self.last:  # what read the last traced layer reads the last copy
            for user in list(node.users):
                if user.op != "output" and user not in written:
                    user.replace_input_with(node, previous[node])
        _write_outputs(program, output, previous, added)
        graph.lint()
        program.graph_module.recompile()

    def _input(self, arg, copies, previous, inputs):
        if arg in copies:
            return copies[arg]
        if arg in self.pairs:  # made by the layer before: its copy of what pairs with it
            return previous[self.pairs[arg]]
        return inputs.get(arg, arg)

    def _placeholders(self, program, layer, tails) -> dict:
        """Layer ``layer``'s weights and state as placeholders, each after the one of the
        same role in the layer before (graph and signature in the same order), with its
        spec's kind and its metadata (shape, dtype); ``tails`` is updated."""
        specs = program.graph_signature.input_specs
        created = {}
        for node, spec in self.state.items():
            target = self.model.renamed(spec.target, self.traced - 1, layer)
            tail, tail_spec = tails[node]
            with program.graph.inserting_after(tail):
                placeholder = program.graph.placeholder(re.sub(r"\W", "_", node.name[:2] + target))
            placeholder.meta = dict(node.meta)
            new = InputSpec(spec.kind, TensorArgument(placeholder.name), target, spec.persistent)
            specs.insert(specs.index(tail_spec) + 1, new)
            values = program.state_dict if spec.target in program.state_dict else program.constants
            value = self.model.tensor(target)
            is_parameter = isinstance(values[spec.target], torch.nn.Parameter)
            values[target] = torch.nn.Parameter(value, requires_grad=False) if is_parameter else value
            created[node] = placeholder
            tails[node] = (placeholder, new)
        return created


class _Matcher:
    """Pairs a node of layer ``traced - 2`` with one of layer ``traced - 1``: their inputs
    must correspond (``pair`` returns why not)."""

    def __init__(self, program, model, owner, traced, specs):
        self.program, self.model, self.owner, self.traced, self.specs = program, model, owner, traced, specs
        self.pairs = {}  # layer traced - 2's node -> layer traced - 1's
        self.carried = {}  # layer traced - 3's node -> layer traced - 2's that takes its role

    def pair(self, a, b):
        if a.op != b.op or a.target != b.target:
            return f"{a.target} against {b.target}"
        why = self._match(a.args, b.args) or self._match(a.kwargs, b.kwargs)
        if why is None:
            self.pairs[a] = b
        return why

    def _match(self, x, y):
        if isinstance(x, torch.fx.Node) and isinstance(y, torch.fx.Node):
            return self._inputs(x, y)
        if isinstance(x, (list, tuple)) and type(x) is type(y) and len(x) == len(y):
            return next((why for p, q in zip(x, y) if (why := self._match(p, q))), None)
        if isinstance(x, dict) and isinstance(y, dict) and x.keys() == y.keys():
            return next((why for key in x if (why := self._match(x[key], y[key]))), None)
        if type(x) is type(y) and not isinstance(x, (torch.fx.Node, list, tuple, dict)) and x == y:
            return None
        return f"{_shown(x)} against {_shown(y)}"

    def _inputs(self, x, y):
        before, last = self.traced - 2, self.traced - 1
        layers = (self.owner.get(x), self.owner.get(y))
        if x is y:  # one value both read: made outside the layers, or by the first ones
            return None if layers[0] is None or layers[0] < before else f"both read {x.name}"
        if x.op == "placeholder" and y.op == "placeholder":
            if layers == (before, last) and self.specs[x.name].kind is self.specs[y.name].kind \
                    and self.model.renamed(self.specs[x.name].target, before, last) == self.specs[y.name].target:
                return None
            if layers == (None, None) and x.name in self.specs and y.name in self.specs and self._equal(x, y):
                return None  # a constant each layer lifted of its own
            return f"{x.name} against {y.name}"
        if layers == (before, last) and self.pairs.get(x) is y:
            return None
        if layers == (before - 1, before) and self.carried.setdefault(x, y) is y:
            return None
        return f"{x.name} against {y.name}"

    def _equal(self, x, y) -> bool:
        values = [_value(self.program, self.specs[node.name].target) for node in (x, y)]
        return all(isinstance(v, torch.Tensor) for v in values) and values[0].dtype == values[1].dtype \
            and torch.equal(values[0], values[1])


def _value(program, target):
    return program.state_dict.get(target, program.constants.get(target))


def _same(tensor, traced) -> bool:
    """Whether ``tensor`` holds what ``traced`` does: the same memory, or equal values."""
    if not isinstance(tensor, torch.Tensor) or not isinstance(traced, torch.Tensor) \
            or (tensor.dtype, tensor.shape) != (traced.dtype, traced.shape):
        return False
    if tensor.untyped_storage().data_ptr() == traced.untyped_storage().data_ptr():
        return (tensor.storage_offset(), tensor.stride()) == (traced.storage_offset(), traced.stride())
    return torch.equal(tensor, traced)


def _layer_of(node, layer_path: str, owner: dict):
    """The layer ``node`` belongs to (see the module's docstring), or None."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in stack.values():
        found = re.match(rf"{re.escape(layer_path)}\.(\d+)(\.|$)", path)
        if found:
            return int(found.group(1))
    inputs = node.all_input_nodes
    read = {owner[n] for n in inputs if n.op == "placeholder" and n in owner}
    if len(read) == 1:
        return read.pop()
    if not stack and inputs:
        made = {owner.get(n) for n in inputs}
        if len(made) == 1 and None not in made:
            return made.pop()
    return None


def _escapes(program, before, last):
    """Why copies of ``last`` could not stand in for it, or None: a node outside the
    last two layers reads the one before (other than as a state update), or reads the
    last before all of it is computed (the copies go after it)."""
    inside = set(before) | set(last)
    order = {node: index for index, node in enumerate(program.graph.nodes)}
    output = program.graph.output_node()
    updates = {value for spec, value in zip(program.graph_signature.output_specs, output.args[0])
               if spec.kind is OutputKind.BUFFER_MUTATION}
    for node in before:
        for user in node.users:
            if user not in inside and not (user is output and node in updates):
                return f"{user.name}, outside the layers, reads layer {node.name}"
    for node in last:
        for user in node.users:
            if user not in inside and user is not output and order[user] < order[last[-1]]:
                return f"{user.name} reads {node.name} before the last layer ends"
    return None


def _updates_of_others(program, model, owner, traced):
    """Why not, when one of the last two layers updates a state that is not its own
    (each copy would write it again)."""
    output = program.graph.output_node()
    for spec, value in zip(program.graph_signature.output_specs, output.args[0]):
        layer = owner.get(value)
        if spec.kind is OutputKind.BUFFER_MUTATION and layer in (traced - 2, traced - 1) \
                and model.layer_of(spec.target) != layer:
            return f"layer {layer} updates {spec.target}, which is not its own"
    return None


def _write_outputs(program, output, final: dict, added: list) -> None:
    """The program's outputs: the copies' state updates after the traced layers', and
    what the last traced layer returned now the last copy's."""
    specs, values = [], []
    for spec, value in zip(program.graph_signature.output_specs, output.args[0]):
        if spec.kind is not OutputKind.BUFFER_MUTATION and value in final:
            value = final[value]
            spec = OutputSpec(spec.kind, TensorArgument(value.name), spec.target)
        specs.append(spec)
        values.append(value)
    at = max((i + 1 for i, spec in enumerate(specs) if spec.kind is OutputKind.BUFFER_MUTATION), default=0)
    specs[at:at] = [spec for spec, _ in added]
    values[at:at] = [value for _, value in added]
    program.graph_signature.output_specs[:] = specs
    output.args = (tuple(values),) if isinstance(output.args[0], tuple) else (values,)


def _renamed_meta(meta: dict, layer_path: str, layer: int, other: int, handles) -> dict:
    copied = dict(meta)
    if "nn_module_stack" in meta:
        old, new = f"{layer_path}.{layer}", f"{layer_path}.{other}"
        copied["nn_module_stack"] = {
            key: (re.sub(rf"^{re.escape(old)}(?=\.|$)", new, path), kind) for key, (path, kind) in meta["nn_module_stack"].items()}
    if "debug_handle" in meta:
        copied["debug_handle"] = handles.next()
    return copied


class _DebugHandles:
    """Fresh debug handles (ExecuTorch numbers every node) past the graph's largest."""

    def __init__(self, graph):
        self.last = max((node.meta.get("debug_handle") or 0 for node in graph.nodes
                         if isinstance(node.meta.get("debug_handle"), int)), default=0)

    def next(self) -> int:
        self.last += 1
        return self.last


def _shown(value) -> str:
    return value.name if isinstance(value, torch.fx.Node) else repr(value)
