"""``EtMlxBackend``: ExecuTorch's entry point that turns a claimed edge subgraph into
an etmlx payload. Weights go to the NamedDataStore; the payload only names them."""

from typing import List

import torch
from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from etmlx import progress
from etmlx.errors import ExportError
from etmlx.serializer import serialize

from . import rules  # noqa: F401  (registers every rule)
from .arguments import bind
from .context import LoweringContext
from .folding import fold_constant
from .fusions import fuse
from .growable_buffers import grow_with_the_window
from .layout import cancel_transposes
from .passes import remove_dead_nodes
from .registry import check_node, getitem_source, mark_frozen_placeholders, rule_for

class EtMlxBackend(BackendDetails):
    """Named ``EtMlxBackend``, not ``MLXBackend``: ExecuTorch looks backends up by class
    name and its wheel already ships an ``MLXBackend``. Its name is ``BACKEND_ID``."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: List[CompileSpec]) -> PreprocessResult:
        store = NamedDataStore()
        graph = lower_program(edge_program, store)
        return PreprocessResult(
            processed_bytes=serialize(graph),
            data_store_output=store.get_named_data_store_output(),
        )


def lower_program(program: ExportedProgram, store: NamedDataStore):
    """Lowers every node of ``program`` (already checked by the partitioner) to a GraphT."""
    ctx = LoweringContext(store)
    mark_frozen_placeholders(program)
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    constant_names = {
        **signature.inputs_to_parameters,
        **signature.inputs_to_buffers,
        **signature.inputs_to_lifted_tensor_constants,
    }
    placeholders = {}
    calls = sum(node.op == "call_function" for node in program.graph.nodes)
    with progress.bar("lowering to MLX", calls) as lowered:
        for node in program.graph.nodes:
            if node.op == "placeholder":
                placeholders[node.name] = node
                target = constant_names.get(node.name)
                if target is None:
                    ctx.add_input(node)
                elif target in mutated:
                    ctx.add_buffer(node, target, _state(program, target))
                else:
                    ctx.constant_values[node] = _state(program, target)
            elif node.op == "call_function":
                _lower_node(ctx, node)
                lowered.advance()
            elif node.op == "output":
                _lower_outputs(ctx, program, node, placeholders)
    remove_dead_nodes(ctx.graph)
    cancel_transposes(ctx.graph, ctx.slot_ranks())
    remove_dead_nodes(ctx.graph)  # the constants a region re-shaped
    grow_with_the_window(ctx.graph, ctx.holds_zeros)
    ctx.store_named_data()
    return ctx.graph


def _lower_node(ctx: LoweringContext, node) -> None:
    source = getitem_source(node)
    if source is not None:
        ctx.bind(node, ctx.item(source, node.args[1]))
        return
    if fold_constant(ctx, node):
        return
    reason = check_node(node)
    if reason is not None:
        raise ExportError(f"etmlx cannot lower {node.format_node()}: {reason}")
    if not fuse(ctx, node):
        rule_for(node).lower(ctx, node, bind(node))


def _lower_outputs(ctx: LoweringContext, program: ExportedProgram, node, placeholders) -> None:
    inputs_by_target = {spec.target: spec.arg.name for spec in program.graph_signature.input_specs}
    for spec, value in zip(program.graph_signature.output_specs, node.args[0]):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            ctx.update_buffer(placeholders[inputs_by_target[spec.target]], value)
        else:
            ctx.add_output(value)


def _state(program: ExportedProgram, target: str) -> torch.Tensor:
    if target in program.state_dict:
        return program.state_dict[target]
    return program.constants[target]
