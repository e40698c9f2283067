"""``MlxPartitioner``: tags the nodes MLX computes, using the lowering rules' checks."""

import logging
import operator

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from etmlx.lowering.preprocess import EtMlxBackend  # noqa: F401  (ExecuTorch finds backends by class name)
from etmlx.serializer import BACKEND_ID
from etmlx.lowering.registry import check_node, getitem_source, mark_frozen_placeholders, op_name

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
            # A size (sym_size, size arithmetic) goes wherever every user of it goes.
            reason = check_node(node)
            if reason is None and not all(self.check(user) is None for user in node.users):
                reason = "its result is used by a call that stays outside MLX"
            return reason
        return check_node(node)

    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and self.check(node) is None


def _produces_int(node) -> bool:
    return isinstance(node.meta.get("val"), torch.SymInt)


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
        if not self.keep_fused:
            return exported_program
        return retarget_fused_calls(exported_program, self.report)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        mark_frozen_placeholders(exported_program)
        support = _Support()
        graph_module = exported_program.graph_module
        report = PartitionReport()
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target is not operator.getitem:
                report.record(op_name(node.target), node.name, support.check(node))
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
        tag_mutated_buffer(exported_program)
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)
