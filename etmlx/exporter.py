"""``etmlx.export``: nn.Module -> torch.export -> MLX partition and lowering -> .pte."""

import contextlib
import functools
import logging
import os
from dataclasses import dataclass, field

from .errors import ExportError

log = logging.getLogger("etmlx")


@dataclass
class ExportResult:
    """What ``export`` wrote, and what MLX took (``report``: a PartitionReport)."""

    path: str
    size_bytes: int
    report: object
    quantized: tuple = ()  # the layers ``quantize=`` (or a GGUF file) quantized, by module name
    formats: dict = field(default_factory=dict)  # {quantized layer: the format it runs in}
    declined: dict = field(default_factory=dict)  # a GGUF file's: {tensor left float: why}


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
    ``mx.gather_mm`` (``windowed_cache.batched_experts``) while tracing: their default form
    leaves ``histc``, which is not in ExecuTorch's Core ATen, in the graph."""
    stack = contextlib.ExitStack()
    models = [m for m in module.modules() if callable(getattr(m, "_can_set_experts_implementation", None))]
    if models:
        from .windowed_cache import batched_experts

        stack.enter_context(batched_experts(models[0]))
    return stack


def lower_methods(methods: dict):
    """Lowers ``{method name: ExportedProgram}`` into one program; returns
    (ExecutorchProgramManager, PartitionReport). An entry whose value is a constant (an
    int, float, bool, or a list of them) is a constant method: a method of no inputs that
    returns it (an LLM runner's metadata, ``causal_lm.export_methods``).

    ``to_edge`` then ``to_backend`` rather than ``to_edge_transform_and_lower``: the
    latter retraces every program twice (``run_decompositions({})`` to functionalize,
    then the decomposition table), which ``to_edge`` does in one pass. The two agree
    here because the partitioner preserves no ATen op from decomposition: the calls it
    keeps whole (attention, roll) are retargeted to etmlx's own ops first.
    """
    from executorch.exir import EdgeCompileConfig, to_edge
    from torch._export.verifier import SpecViolationError

    from etmlx.partitioner import MlxPartitioner

    from .splits import split_calls_as_slices

    constants = {name: value for name, value in methods.items() if _is_constant(value)}
    methods = {name: program for name, program in methods.items() if name not in constants}
    if not methods:
        raise ExportError("no methods to export")
    partitioner = MlxPartitioner()
    retargeted = {
        name: partitioner.transform_for_pre_decomposition(split_calls_as_slices(program))
        for name, program in methods.items()
    }
    edge = to_edge(retargeted, constant_methods=constants or None, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    for name in methods:
        _share_weights_when_copied(edge.exported_program(name))
    edge = edge.to_backend(partitioner)
    try:
        for name in methods:
            _verify_outside_mlx(edge.exported_program(name))
    except SpecViolationError as error:
        raise ExportError(_not_in_edge_dialect(error, partitioner.report)) from None
    _refuse_declined_custom_ops(partitioner.report)
    for name in methods:
        _keep_initial_values(edge.exported_program(name))
        _rename_inputs_named_like_state(edge.exported_program(name))
    return edge.to_executorch(_backend_config(edge)), partitioner.report


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


def _verify_outside_mlx(program) -> None:
    """ExecuTorch's checks of an edge program (core ATen operators, the dtypes their
    kernels take) on what is left once MLX took its part, instead of on the whole graph
    before partitioning, which ``to_edge`` did twice (a fifth of an LLM's export time):
    the calls MLX took are checked by its own rules."""
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
    from torch._dispatch.python import enable_python_dispatcher
    from torch._export.utils import _detect_fake_mode_from_gm
    from torch._export.verifier import SpecViolationError

    EXIREdgeDialectVerifier(edge_compile_config=EdgeCompileConfig())(program.graph_module)
    gm = program.graph_module
    validator = _kernel_dtype_validator()(gm)
    with enable_python_dispatcher(), _detect_fake_mode_from_gm(gm) or contextlib.nullcontext():
        validator.run(*(node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"))
    if validator.violating_ops:
        calls = "; ".join(f"{op} with {dtypes}" for op, (dtypes, _) in validator.violating_ops.items())
        raise SpecViolationError(f"These operators are taking Tensor inputs with mismatched dtypes: {calls}")


def _kernel_dtype_validator():
    """ExecuTorch's dtype validator, walking past delegate calls: the verifier's own walk
    stops at the first one, leaving the kernels after it unchecked."""
    from executorch.exir.verification.arg_validator import EdgeOpArgValidator
    from torch._ops import HigherOrderOperator

    class Validator(EdgeOpArgValidator):
        def call_function(self, target, args, kwargs):
            if isinstance(target, HigherOrderOperator):
                return self.node.meta["val"]  # the delegate's outputs, as traced
            return super().call_function(target, args, kwargs)

    return Validator


def _not_in_edge_dialect(error, report) -> str:
    """ExecuTorch's refusal of an operator outside the core ATen opset (a stable sort
    MLX declined, say), in one line, with MLX's reason where it declined the call."""
    first = next((line for line in str(error).splitlines() if line.strip()), "").strip().rstrip('".')
    reasons = [
        f"{operator}: {reason}" for operator, entry in report.operators.items()
        for _, reason in (*entry.decomposed, *entry.declined) if operator.replace("::", ".") in first
    ]
    because = f"; MLX declined it ({'; '.join(sorted(set(reasons)))})" if reasons else ""
    return f"ExecuTorch cannot take this program: {first}{because}"


def _refuse_declined_custom_ops(report) -> None:
    """etmlx's own ops have no ExecuTorch kernel: one MLX declined (a sum across ranks in
    float64, say) would fail in ``to_executorch`` as "Missing out variants"."""
    declined = sorted({f"{operator}: {reason}" for operator, entry in report.operators.items()
                       if operator.startswith("etmlx::") for _, reason in entry.declined})
    if declined:
        raise ExportError(f"ExecuTorch has no kernel for etmlx's own ops that MLX declined ({'; '.join(declined)})")


def _share_weights_when_copied(program) -> None:
    """ExecuTorch's ``to_backend`` hands each backend's ``preprocess`` a deep copy of the
    claimed part of the program, weights included: a second copy of the whole model in
    memory (of a memory-mapped checkpoint's too, so far only read in place). The
    program's parameters become ``_SharedWhenCopied`` parameters over the same storage,
    which such a copy shares: preprocess only reads them."""
    import torch

    for name, value in program.state_dict.items():
        if isinstance(value, torch.nn.Parameter) and type(value) is torch.nn.Parameter:
            program.state_dict[name] = _shared_when_copied()(value, requires_grad=False)


@functools.cache
def _shared_when_copied():
    import torch

    class _SharedWhenCopied(torch.nn.Parameter):
        def __deepcopy__(self, memo):
            memo[id(self)] = self
            return self

    return _SharedWhenCopied


def _keep_initial_values(program) -> None:
    """Mutable buffers MLX declined stay with ExecuTorch, which drops their initial
    values unless their placeholders carry ``et_init_buffer`` (delegated buffers carry
    their own in the payload). Set here on exactly those placeholders: ExecuTorch's
    ``InitializedMutableBufferPass`` matches names by substring, and so also marked a
    user input named like a buffer (``scale`` for buffer ``scale``, placeholder
    ``b_scale``), whose program then lost the buffer's updates without an error."""
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    names = {name for name, target in signature.inputs_to_buffers.items() if target in mutated}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            node.meta["et_init_buffer"] = True


def _rename_inputs_named_like_state(program) -> None:
    """Renames method inputs that share a name with a buffer or weight (``forward(self,
    x, scale)`` next to buffer ``scale``). ExecuTorch's write-back of mutated buffers
    looks placeholders up by buffer name and by input name in one table, so such an
    input took the buffer's place: the update was written into the input and the buffer
    kept its old value, with no error. A method's input names are not in the .pte."""
    from torch.export.graph_signature import InputKind, TensorArgument

    signature = program.graph_signature
    state = {spec.target for spec in signature.input_specs if spec.kind is not InputKind.USER_INPUT}
    taken = {node.name for node in program.graph.nodes} | state
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    for spec in signature.input_specs:
        if spec.kind is not InputKind.USER_INPUT or not isinstance(spec.arg, TensorArgument):
            continue
        if spec.arg.name not in state:
            continue
        new = f"{spec.arg.name}_input"
        while new in taken:
            new += "_"
        taken.add(new)
        placeholders[spec.arg.name].name = new
        spec.arg = TensorArgument(name=new)
    program.graph_module.recompile()


def to_executorch(module, example_inputs, dynamic_shapes=None):
    """Exports and lowers ``module`` as method ``forward``."""
    return lower_methods({"forward": trace(module, example_inputs, dynamic_shapes)})


def export_methods(methods, path, tensor_parallel=None, model=None):
    """Writes one ``.pte`` holding several methods, ``{name: ExportedProgram}`` (from
    ``torch.export.export``). Methods that name the same module buffer share its state
    at run time: a ``prefill`` method fills the KV cache a ``decode`` method reads.

    ``tensor_parallel=N``: ``methods`` is a function of a model returning that dict
    (``lambda m: causal_lm.export_methods(m)``), called on each rank's shard of ``model``;
    writes the directory ``path`` of N programs (``etmlx/tensor_parallel.py``)."""
    if tensor_parallel is not None:
        if not callable(methods) or model is None:
            raise ExportError("tensor_parallel= needs methods as a function of the model, and model=")
        return export_ranks(path, tensor_parallel, methods, model)
    program, report = lower_methods(methods)
    return write(program, report, path)


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


def export(
    module, example_inputs, path, dynamic_shapes=None, quantize=None, group_size=64, quantize_embeddings=True,
    tensor_parallel=None,
):
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

    ``tensor_parallel=N`` writes the directory ``path`` of N programs, one per rank of
    ``mlx.launch -n N``, each with its shard of the attention and MLP weights
    (``etmlx/sharding.py``; with ``quantize``, each rank's shards quantized);
    ``etmlx.load(path)`` in each rank runs its own.
    """
    if tensor_parallel is not None:
        quantizing = None if quantize is None else (quantize, group_size, quantize_embeddings)
        return export_ranks(path, tensor_parallel, lambda m: {"forward": trace(m, example_inputs, dynamic_shapes)}, module,
                            quantizing)
    quantized, runs_as = (), {}
    if quantize is not None:
        from .quantization import formats, quantized_copy

        module, quantized = quantized_copy(module, quantize, group_size, quantize_embeddings)
        runs_as = formats(module, quantized)
    program, report = to_executorch(module, example_inputs, dynamic_shapes)
    result = write(program, report, path)
    result.quantized, result.formats = tuple(quantized), runs_as
    return result


@dataclass
class TensorParallelResult:
    path: str  # the directory
    size: int
    ranks: list  # ExportResult per rank
    decisions: list  # ShardDecision, the same on every rank

    @property
    def report(self):
        return self.ranks[0].report


def export_ranks(path, size: int, trace_methods, module, quantize=None) -> TensorParallelResult:
    """Writes ``path/rank<r>.pte`` for each rank's shard of ``module``, and the manifest.

    ``trace_methods(module)`` gives ``{name: ExportedProgram}``: traced once whole, to find
    the blocks that split (``etmlx/shard_plan.py``) and as the reference, then per rank's
    shard (``etmlx/sharding.py``); the ranks' first methods, run together in eager, must
    compute the whole model's (``etmlx/shard_check.py``). ``quantize``: (scheme,
    group_size, embeddings) of ``quantized_copy``, applied to each rank's shard after that
    check (the shards are traced again, quantized)."""
    from .shard_check import check_ranks
    from .shard_plan import find_blocks
    from .sharding import shard
    from .tensor_parallel import write_manifest

    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ExportError(f"tensor_parallel={size!r}: expected a number of ranks, 1 or more")
    whole = trace_methods(module)
    first = next(iter(whole))
    plan = find_blocks(module, whole[first])
    shards = [shard(module, plan, rank, size) for rank in range(size)]
    decisions = shards[0][1]
    if size > 1 and not any(d.sharded for d in decisions):
        found = "; ".join(map(str, decisions)) or "no attention call and no MLP in its graph"
        raise ExportError(f"tensor_parallel={size}: nothing of {type(module).__name__} splits over {size} ranks ({found})")
    traced = [_trace_rank(trace_methods, sharded, rank) for rank, (sharded, _) in enumerate(shards)]
    check_ranks(whole[first], [methods[first] for methods in traced], first)
    quantized = [()] * size
    if quantize is not None:
        from .quantization import quantized_copy

        copies = [quantized_copy(sharded, *quantize) for sharded, _ in shards]
        traced = [_trace_rank(trace_methods, copy, rank) for rank, (copy, _) in enumerate(copies)]
        quantized = [tuple(names) for _, names in copies]
    os.makedirs(path, exist_ok=True)
    ranks = []
    for rank, methods in enumerate(traced):
        program, report = lower_methods(methods)
        ranks.append(write(program, report, os.path.join(path, f"rank{rank}.pte")))
        ranks[-1].quantized = quantized[rank]
    write_manifest(path, size, [str(d) for d in decisions])
    return TensorParallelResult(os.fspath(path), size, ranks, decisions)


def _trace_rank(trace_methods, sharded, rank: int) -> dict:
    try:
        return trace_methods(sharded)
    except Exception as error:
        raise ExportError(f"rank {rank}'s shard does not trace (a head count the model keeps elsewhere?): {error}") from error
