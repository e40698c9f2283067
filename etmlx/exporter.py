"""``etmlx.export``: nn.Module -> torch.export -> MLX partition and lowering -> .pte."""

import logging
import os
import warnings
from dataclasses import dataclass

from .errors import ExportError

log = logging.getLogger("etmlx")


@dataclass
class ExportResult:
    """What ``export`` wrote, and what MLX took (``report``: a PartitionReport)."""

    path: str
    size_bytes: int
    report: object


# Importing executorch logs warnings about optional torchao kernels (CUDA builds)
# and a torch deprecation inside torchao; none concerns an etmlx user.
for _noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_noisy).setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)


def to_executorch(module, example_inputs, dynamic_shapes=None):
    """Exports and lowers ``module``; returns (ExecutorchProgramManager, PartitionReport)."""
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    from etmlx.partitioner import MlxPartitioner

    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"expected a torch.nn.Module to export, got {type(module).__name__}")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    module.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    except Exception as error:
        raise ExportError(f"torch.export could not trace {type(module).__name__}: {error}") from error
    mutable_buffers = list(program.graph_signature.buffers_to_mutate.values())
    partitioner = MlxPartitioner()
    edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
    # Buffers that MLX declined stay with ExecuTorch, which drops their initial values
    # unless named to this pass; delegated buffers carry their own.
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(mutable_buffers)])
    return edge.to_executorch(config), partitioner.report


def export(module, example_inputs, path, dynamic_shapes=None) -> ExportResult:
    """Writes ``module`` as a ``.pte`` at ``path`` whose compute runs on MLX.

    ``example_inputs`` is a tuple of tensors (a single tensor is accepted too);
    ``dynamic_shapes`` is passed to ``torch.export.export``. Calls that MLX cannot
    compute exactly stay outside the delegate and run on the CPU fallback; the
    returned report lists them, and one line is logged when the model is not
    fully delegated.
    """
    program, report = to_executorch(module, example_inputs, dynamic_shapes)
    data = program.buffer
    with open(path, "wb") as f:
        f.write(data)
    if not report.fully_delegated:
        log.warning("%s", report.summary())
    return ExportResult(path=os.fspath(path), size_bytes=len(data), report=report)
