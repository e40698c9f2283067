"""``etmlx.export``: nn.Module -> torch.export -> MLX partition and lowering -> .pte."""

import logging
import os
from dataclasses import dataclass

from .errors import ExportError

log = logging.getLogger("etmlx")


@dataclass
class ExportResult:
    """What ``export`` wrote, and what MLX took (``report``: a PartitionReport)."""

    path: str
    size_bytes: int
    report: object
    quantized: tuple = ()  # the layers ``quantize=`` quantized, by module name


def trace(module, example_inputs, dynamic_shapes=None):
    """``torch.export.export`` of ``module`` in eval mode without autograd, with errors
    turned into one ``ExportError`` that names the module."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"expected a torch.nn.Module to export, got {type(module).__name__}")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    module.eval()
    try:
        with torch.no_grad():
            return torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    except Exception as error:
        raise ExportError(f"torch.export could not trace {type(module).__name__}: {error}") from error


def lower_methods(methods: dict):
    """Lowers ``{method name: ExportedProgram}`` into one program; returns
    (ExecutorchProgramManager, PartitionReport).

    ``to_edge`` then ``to_backend`` rather than ``to_edge_transform_and_lower``: the
    latter retraces every program twice (``run_decompositions({})`` to functionalize,
    then the decomposition table), which ``to_edge`` does in one pass. The two agree
    here because the partitioner preserves no ATen op from decomposition: the calls it
    keeps whole (attention, roll) are retargeted to etmlx's own ops first.
    """
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    from etmlx.partitioner import MlxPartitioner

    from .splits import split_calls_as_slices

    if not methods:
        raise ExportError("no methods to export")
    partitioner = MlxPartitioner()
    retargeted = {
        name: partitioner.transform_for_pre_decomposition(split_calls_as_slices(program))
        for name, program in methods.items()
    }
    edge = to_edge(retargeted).to_backend(partitioner)
    # Buffers MLX declined stay with ExecuTorch, which drops their initial values unless
    # named to this pass; delegated buffers carry their own in the payload.
    kept = {
        target
        for name in methods
        for target in edge.exported_program(name).graph_signature.buffers_to_mutate.values()
    }
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(sorted(kept))])
    return edge.to_executorch(config), partitioner.report


def to_executorch(module, example_inputs, dynamic_shapes=None):
    """Exports and lowers ``module`` as method ``forward``."""
    return lower_methods({"forward": trace(module, example_inputs, dynamic_shapes)})


def export_methods(methods: dict, path) -> ExportResult:
    """Writes one ``.pte`` holding several methods, ``{name: ExportedProgram}`` (from
    ``torch.export.export``). Methods that name the same module buffer share its state
    at run time: a ``prefill`` method fills the KV cache a ``decode`` method reads."""
    program, report = lower_methods(methods)
    return _write(program, report, path)


def _write(program, report, path) -> ExportResult:
    data = program.buffer
    with open(path, "wb") as f:
        f.write(data)
    if not report.fully_delegated:
        log.warning("%s", report.summary())
    return ExportResult(path=os.fspath(path), size_bytes=len(data), report=report)


def export(
    module, example_inputs, path, dynamic_shapes=None, quantize=None, group_size=64, quantize_embeddings=True
) -> ExportResult:
    """Writes ``module`` as a ``.pte`` at ``path`` whose compute runs on MLX.

    ``example_inputs`` is a tuple of tensors (a single tensor is accepted too);
    ``dynamic_shapes`` is passed to ``torch.export.export``. Calls that MLX cannot
    compute exactly stay outside the delegate and run on the CPU fallback; the
    returned report lists them, and one line is logged when the model is not
    fully delegated.

    ``quantize="int4"`` or ``"int8"`` quantizes the weights of a copy of ``module``
    first (torchao's weight-only quantization of linear layers, and of embeddings unless
    ``quantize_embeddings`` is False, per ``group_size`` values of each row, or per row
    with ``group_size=None``): they run on MLX's quantized kernels. A model already
    quantized with torchao exports as it is, without ``quantize``.
    """
    quantized = ()
    if quantize is not None:
        from .quantization import quantized_copy

        module, quantized = quantized_copy(module, quantize, group_size, quantize_embeddings)
    program, report = to_executorch(module, example_inputs, dynamic_shapes)
    result = _write(program, report, path)
    result.quantized = tuple(quantized)
    return result
