"""``MlxPartitioner``: tags the nodes MLX computes, using the lowering rules' checks."""

import logging
import operator

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from etmlx.lowering.preprocess import EtMlxBackend  # noqa: F401  (ExecuTorch finds backends by class name)
from etmlx.serializer import BACKEND_ID
from etmlx.lowering.registry import check_node, getitem_source, mark_frozen_placeholders, op_name

from etmlx.lowering.fusions.delegate_ops import expand_delegate_ops
from etmlx.lowering.fusions.fused_calls import retarget_fused_calls
from .report import PartitionReport

log = logging.getLogger("etmlx")


class _Support(OperatorSupportBase):
    """Per-node verdicts, computed once per graph and remembered for the report."""

    def __init__(self):
        self.verdicts: dict = {}

    def check(self, node):
        """None when MLX takes ``node``; otherwise why not."""
        if node not in self.verdicts:
            self.verdicts[node] = self._decide(node)
        return self.verdicts[node]

    def _decide(self, node):
        source = getitem_source(node)
        if source is not None:
            return self.check(source)
        if _produces_int(node) and node.users:
            if _computed_from_a_host_read(node):
                # The delegate then takes only the final size, and compiles once per its value,
                # not once per value read (every decode position).
                return "size arithmetic over a value read on the host stays on the host"
            # A size (sym_size, size arithmetic) goes wherever every user of it goes.
            reason = check_node(node)
            if reason is None and not all(self.check(user) is None for user in node.users):
                reason = "its result is used by a call that stays outside MLX"
            return reason
        return check_node(node)

    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and self.check(node) is None


def _produces_int(node) -> bool:
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool))


# ExecuTorch's scalar ops that read a size from a tensor's value (``item()``) or check one:
# they run in its plan, on the host, before the delegate the size shapes.
_HOST_SIZE_READS = {"aten::_local_scalar_dense", "aten::_assert_scalar", "aten::sym_constrain_range",
                    "aten::sym_constrain_range_for_size"}
# What may compute only the value such a read takes, besides a size's arithmetic: one element.
_FEEDS_A_SIZE_READ = {"aten::select_copy.int", "aten::slice_copy.Tensor"}


def _reads_a_size_on_the_host(node) -> bool:
    """A size read on the host (``cache_position[-1].item()`` sizing the attention window of
    ``causal_lm``), the arithmetic over it, or a size or element computed only for one: not
    MLX's work declined."""
    name = op_name(node.target)
    if name in _HOST_SIZE_READS or _computed_from_a_host_read(node):
        return True
    feeds = _produces_int(node) or name in _FEEDS_A_SIZE_READ
    return feeds and bool(node.users) and all(_reads_a_size_on_the_host(user) for user in node.users)


def _computed_from_a_host_read(node) -> bool:
    """A size computed (through other sizes) from a value ``item()`` read on the host."""
    if not _produces_int(node):
        return False
    sources = [n for n in node.all_input_nodes if n.op == "call_function"]
    return any(op_name(n.target) in _HOST_SIZE_READS or _computed_from_a_host_read(n) for n in sources)


class MlxPartitioner(Partitioner):
    """Claims every call whose lowering rule accepts it; the rest stays with ExecuTorch.

    ``keep_fused=False`` lets every fused op (attention, roll) decompose, as if MLX had
    declined it: for comparing the fused kernel with its decomposition.
    """

    def __init__(self, keep_fused: bool = True):
        super().__init__()
        self.keep_fused = keep_fused
        self.delegation_spec = DelegationSpec(BACKEND_ID, [])
        self.report = PartitionReport()

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        expand_delegate_ops(exported_program)  # ExecuTorch's MLX delegate's ops: no kernel runs them otherwise
        if not self.keep_fused:
            return exported_program
        return retarget_fused_calls(exported_program, self.report.record_decomposed)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        mark_frozen_placeholders(exported_program)
        support = _Support()
        graph_module = exported_program.graph_module
        report = PartitionReport()
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem:
                continue
            reason = support.check(node)
            if reason is not None and _reads_a_size_on_the_host(node):
                report.record_host(op_name(node.target), node.name)
            else:
                report.record(op_name(node.target), node.name, reason)
        self.report.merge(report)
        for line in report.declined_lines():
            log.info("%s", line)

        # A lone claimed node between declined ones is still worth delegating.
        partitions = CapabilityBasedPartitioner(
            graph_module, support, allows_single_node_partition=True
        ).propose_partitions()
        tags = {}
        for partition in partitions:
            tag = f"etmlx_{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        _tag_mutated_buffers(exported_program)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)


def _tag_mutated_buffers(program: ExportedProgram) -> None:
    """Moves each mutable buffer into the delegate that reads it and computes its new
    value, when one delegate does both; a buffer that more than one delegate (or the
    CPU fallback) reads or writes stays with ExecuTorch, which passes it to each.

    ExecuTorch's ``tag_mutated_buffer`` gives a buffer read by several delegates to one
    of them even when another computes its update, and ``to_backend`` then fails on a
    buffer output that points to no buffer (an LLM whose per-layer cache position is
    written once and read by every layer, split by one declined call)."""
    signature = program.graph_signature
    buffer_of_input = signature.inputs_to_buffers
    updated_by = {}  # buffer target -> the node computing its new value
    output = program.graph.output_node()
    for value in output.args[0]:
        target = signature.buffers_to_mutate.get(getattr(value, "name", None))
        if target is not None:
            updated_by[target] = value
    for node in program.graph.nodes:
        target = buffer_of_input.get(node.name) if node.op == "placeholder" else None
        if target not in updated_by:
            continue
        parties = list(node.users) + [updated_by[target]]
        tags = {party.meta.get("delegation_tag") for party in parties if party is not output}
        if len(tags) == 1 and None not in tags:
            node.meta["delegation_tag"] = tags.pop()
