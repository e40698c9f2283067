"""The stages of an export: ``torch.export`` (``trace``), ExecuTorch's edge program with
MLX's partition lowered into it (``lower_methods``), and the file (``write``). The public
entry points that chain them are in ``exporter.py``; tensor parallelism runs them per rank
(``parallel/export.py``)."""

import contextlib
import gc
import logging
import os
import threading
from dataclasses import dataclass, field

from .errors import ExportError

log = logging.getLogger("etmlx")

# An export allocates millions of short-lived objects (graph nodes, fake tensors, symbolic
# sizes) over a heap of millions (torch, transformers, executorch, and a caller's own). At
# Python's default generation-0 threshold of 700 the collector also walks that whole heap
# every few tens of thousands of allocations: measured, 28% of the lowering tests' time
# (a process that holds earlier exports), within noise for one export of a 1B-shaped
# model in a fresh process. Cycles are still collected, every 100,000 allocations; peak
# memory did not move (weights are freed by reference counts, not by the collector).
EXPORT_COLLECTION_THRESHOLD = 100_000
_collection_lock = threading.Lock()
_exports_running = 0
_thresholds_before = gc.get_threshold()


@contextlib.contextmanager
def fewer_collections():
    """Inside (also as a decorator): Python's cyclic collector starts a pass every
    ``EXPORT_COLLECTION_THRESHOLD`` allocations rather than 700; its thresholds are
    put back when the last export running in the process returns."""
    global _exports_running, _thresholds_before
    with _collection_lock:
        if _exports_running == 0:
            _thresholds_before = gc.get_threshold()
            gc.set_threshold(max(_thresholds_before[0], EXPORT_COLLECTION_THRESHOLD), *_thresholds_before[1:])
        _exports_running += 1
    try:
        yield
    finally:
        with _collection_lock:
            _exports_running -= 1
            if _exports_running == 0:
                gc.set_threshold(*_thresholds_before)


@dataclass
class ExportResult:
    """What ``export`` wrote, and what MLX took (``report``: a PartitionReport)."""

    path: str
    size_bytes: int
    report: object
    quantized: tuple = ()  # the layers ``quantize=`` (or a GGUF file) quantized, by module name
    formats: dict = field(default_factory=dict)  # {quantized layer: the format it runs in}
    declined: dict = field(default_factory=dict)  # a GGUF file's: {tensor left float: why}


@fewer_collections()
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
        with torch.no_grad(), _experts_as_batched_matmuls(module):
            return torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    except Exception as error:
        raise ExportError(f"torch.export could not trace {type(module).__name__}: {error}") from error


def _experts_as_batched_matmuls(module):
    """transformers' mixture-of-experts models in the experts form lowering turns into
    ``mx.gather_mm`` (``etmlx.llm.experts.batched_experts``) while tracing: their default form
    leaves ``histc``, which is not in ExecuTorch's Core ATen, in the graph."""
    stack = contextlib.ExitStack()
    models = [m for m in module.modules() if callable(getattr(m, "_can_set_experts_implementation", None))]
    if models:
        from .llm.experts import batched_experts

        stack.enter_context(batched_experts(models[0]))
    return stack


@fewer_collections()
def lower_methods(methods: dict):
    """Lowers ``{method name: ExportedProgram}`` into one program; returns
    (ExecutorchProgramManager, PartitionReport). An entry whose value is a constant (an
    int, float, bool, or a list of them) is a constant method: a method of no inputs that
    returns it (an LLM runner's metadata, ``causal_lm.export_methods``). An entry that is a
    ``lowering.repeated_layers.LayersTraced`` is a method traced with its first layers, whose
    other layers are written once it is decomposed; where one cannot be, every such entry
    is traced whole (its ``full()``) and lowered again.

    ``to_edge`` then ``to_backend`` rather than ``to_edge_transform_and_lower``: the
    latter retraces every program twice (``run_decompositions({})`` to functionalize,
    then the decomposition table), which ``to_edge`` does in one pass. The two agree
    here because the partitioner preserves no ATen op from decomposition: the calls it
    keeps whole (attention, roll) are retargeted to etmlx's own ops first.
    """
    from torch._export.verifier import SpecViolationError

    from etmlx.lowering import edge_passes
    from etmlx.lowering.repeated_layers import LayersTraced
    from etmlx.lowering.splits import split_calls_as_slices
    from etmlx.partitioner import MlxPartitioner

    constants = {name: value for name, value in methods.items() if _is_constant(value)}
    layered = {name: program for name, program in methods.items() if isinstance(program, LayersTraced)}
    traced = {name: layered[name].program if name in layered else program
              for name, program in methods.items() if name not in constants}
    if not traced:
        raise ExportError("no methods to export")
    partitioner = MlxPartitioner()
    retargeted = {
        name: partitioner.transform_for_pre_decomposition(split_calls_as_slices(program))
        for name, program in traced.items()
    }
    edge = edge_program(retargeted, constants or None)
    refused = {name: why for name, program in layered.items() if (why := program.repeat(edge.exported_program(name)))}
    if refused:  # traced whole after all
        log.info("etmlx traces every layer: %s", "; ".join(f"{name}: {why}" for name, why in refused.items()))
        return lower_methods({name: program.full() if name in layered else program for name, program in methods.items()})
    methods = traced
    for name in methods:
        edge_passes.share_weights_when_copied(edge.exported_program(name))
    edge = edge.to_backend(partitioner)
    try:
        for name in methods:
            edge_passes.verify_outside_mlx(edge.exported_program(name))
    except SpecViolationError as error:
        raise ExportError(edge_passes.not_in_edge_dialect(error, partitioner.report)) from None
    edge_passes.refuse_declined_custom_ops(partitioner.report)
    for name in methods:
        edge_passes.keep_initial_values(edge.exported_program(name))
        edge_passes.rename_inputs_named_like_state(edge.exported_program(name))
    with edge_passes.passes_skipped_where_nothing_to_rewrite(), edge_passes.delegate_outputs_from_their_trace():
        return edge.to_executorch(_backend_config(edge)), partitioner.report


def edge_program(programs, constant_methods=None, preserve_ops=()):
    """ExecuTorch's ``to_edge`` of ``programs`` (an ExportedProgram, or ``{method name:
    ExportedProgram}``), its IR checks deferred to what MLX leaves, through etmlx's
    shortcuts: passes with nothing to rewrite skipped, five call-by-call rewrites in one
    retrace (``lowering.edge_passes``). ``preserve_ops``: ATen operators kept whole."""
    from executorch.exir import EdgeCompileConfig, to_edge

    from etmlx.lowering import edge_passes
    from etmlx.lowering.composite_ops import collected_once

    config = EdgeCompileConfig(_check_ir_validity=False, preserve_ops=list(preserve_ops))
    with collected_once(), edge_passes.passes_skipped_where_nothing_to_rewrite(), edge_passes.rewrites_in_one_retrace():
        return to_edge(programs, constant_methods=constant_methods, compile_config=config)


# Apple silicon's page. Metal wraps memory aligned to a page as a buffer without a copy,
# so the native backend can use a mapped file's weights in place there.
PAGE_ALIGNMENT = 16384


def _backend_config(edge):
    """Segments (weights, payloads) start at page boundaries when the padding costs under
    1% of the weights; small programs keep ExecuTorch's default, 128 bytes."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    lowered = [m for name in edge.methods for _, m, _ in get_lowered_submodules(edge.exported_program(name).graph_module)]
    blobs = {  # by key: the methods' delegates name the weights they share alike
        key: len(m.named_data_store_output.buffers[entry.buffer_index])
        for m in lowered
        for key, entry in m.named_data_store_output.pte_data.items()
    }
    segments = len(blobs) + len(lowered)
    paged = segments * PAGE_ALIGNMENT <= sum(blobs.values()) // 100
    return ExecutorchBackendConfig(segment_alignment=PAGE_ALIGNMENT if paged else 128)


def _is_constant(value) -> bool:
    scalar = (bool, int, float)
    return isinstance(value, scalar) or (isinstance(value, (list, tuple)) and all(isinstance(v, scalar) for v in value))


def to_executorch(module, example_inputs, dynamic_shapes=None):
    """Exports and lowers ``module`` as method ``forward``."""
    return lower_methods({"forward": trace(module, example_inputs, dynamic_shapes)})


def write(program, report, path) -> ExportResult:
    """Writes the program beside ``path`` and renames it into place: a program loaded
    from the old file maps it, and keeps reading it."""
    path = os.fspath(path)
    staging = f"{path}.{os.getpid()}.partial"
    try:
        with open(staging, "wb") as f:
            program.write_to_file(f)  # streamed: no second copy of the weights in memory
            size = f.tell()
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
    if not report.fully_delegated:
        log.warning("%s", report.summary())
    return ExportResult(path=path, size_bytes=size, report=report)
