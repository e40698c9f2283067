"""Ahead-of-time half of the test backend (see shim_fake_backend.py): add/sub/mul/sin
subgraphs serialized as JSON, plus one named blob and one compile spec."""

import json
from typing import final

from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import generate_pattern_op_partitions
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.dialects._ops import ops as exir_ops
from torch.fx.passes.operator_support import OperatorSupportBase

from shim_fake_backend import BACKEND_ID, NAMED_KEY

_SUPPORTED = {
    exir_ops.edge.aten.sin.default: "sin",
    exir_ops.edge.aten.add.Tensor: "add",
    exir_ops.edge.aten.sub.Tensor: "sub",
    exir_ops.edge.aten.mul.Tensor: "mul",
}


@final
class EtmlxShimTestBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program, compile_specs):
        graph = {"inputs": [], "nodes": [], "outputs": []}
        for node in edge_program.graph.nodes:
            if node.op == "placeholder":
                graph["inputs"].append(node.name)
            elif node.op == "call_function":
                graph["nodes"].append([node.name, _SUPPORTED[node.target], [a.name for a in node.args]])
            elif node.op == "output":
                graph["outputs"] = [a.name for a in node.args[0]]
        store = NamedDataStore()
        store.add_named_data(NAMED_KEY, b"hello")
        return PreprocessResult(
            processed_bytes=json.dumps(graph).encode(),
            debug_handle_map={},
            data_store_output=store.get_named_data_store_output(),
        )


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and node.target in _SUPPORTED


class TestPartitioner(Partitioner):
    def partition(self, edge_program):
        tags = {}
        for partition in generate_pattern_op_partitions(edge_program.graph_module, op_support=_Support()):
            tag = f"tag{partition.id or 0}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = DelegationSpec(BACKEND_ID, [CompileSpec("mode", b"fast")])
        return PartitionResult(tagged_exported_program=edge_program, partition_tags=tags)


assert EtmlxShimTestBackend.__name__ == BACKEND_ID
