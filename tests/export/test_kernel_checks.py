"""What ExecuTorch's kernels run is checked after partitioning, not before: the
operators and dtypes of the calls MLX left, the kernels after a delegate call too."""

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
from torch._export.verifier import SpecViolationError

from etmlx.lowering import edge_passes
from etmlx.partitioner import MlxPartitioner


class FloatThenDouble(torch.nn.Module):
    """relu on MLX, then a float64 add MLX declines: a kernel after the delegate call."""

    def forward(self, x, z):
        return torch.relu(x).double() + z


def _lowered():
    program = torch.export.export(FloatThenDouble(), (torch.randn(4), torch.randn(4, dtype=torch.float64)))
    edge = to_edge(program, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_backend(MlxPartitioner())
    return edge.exported_program()


def test_a_valid_program_passes():
    edge_passes.verify_outside_mlx(_lowered())


def test_a_kernel_after_a_delegate_call_is_dtype_checked():
    program = _lowered()
    add = next(n for n in program.graph.nodes if "aten.add" in str(n.target))
    add.meta["val"] = add.meta["val"].to(torch.float32)  # the add now claims float64 + float64 -> float32
    EXIREdgeDialectVerifier(edge_compile_config=EdgeCompileConfig())(program.graph_module)  # its walk stops at the delegate
    with pytest.raises(SpecViolationError, match="mismatched dtypes: .*aten.add.Tensor"):
        edge_passes.verify_outside_mlx(program)
