"""``etmlx.export`` and ``etmlx.export_methods``: nn.Module or ExportedPrograms -> .pte,
through the stages in ``pipeline.py``; ``tensor_parallel=N`` through ``parallel/export.py``."""

from .errors import ExportError
from .lowering.spilled import files_beside
from .pipeline import lower_methods, to_executorch, trace, write


def export_methods(methods, path, *, tensor_parallel=None, model=None):
    """Writes one ``.pte`` holding several methods, ``{name: ExportedProgram}`` (from
    ``torch.export.export``). Methods that name the same module buffer share its state
    at run time: a ``prefill`` method fills the KV cache a ``decode`` method reads.

    ``tensor_parallel=N``: ``methods`` is a function of a model returning that dict
    (``lambda m: causal_lm.export_methods(m)``), called on each rank's shard of ``model``;
    writes the directory ``path`` of N programs (``etmlx/parallel/ranks.py``)."""
    if tensor_parallel is not None:
        if not callable(methods) or model is None:
            raise ExportError("tensor_parallel= needs methods as a function of the model, and model=")
        from .parallel.export import export_ranks

        return export_ranks(path, tensor_parallel, methods, model)
    with files_beside(path):  # large constants wait in files, not in memory, until written
        program, report = lower_methods(methods)
        return write(program, report, path)


def export(
    module, example_inputs, path, *, dynamic_shapes=None, quantize=None, group_size=64, quantize_embeddings=True,
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
    (``etmlx/parallel/sharding.py``; with ``quantize``, each rank's shards quantized);
    ``etmlx.load(path)`` in each rank runs its own.
    """
    if tensor_parallel is not None:
        quantizing = None if quantize is None else (quantize, group_size, quantize_embeddings)
        from .parallel.export import export_ranks

        return export_ranks(path, tensor_parallel, lambda m: {"forward": trace(m, example_inputs, dynamic_shapes)}, module,
                            quantizing)
    quantized, runs_as = (), {}
    if quantize is not None:
        from .quant.weights import formats, quantized_copy

        module, quantized = quantized_copy(module, quantize, group_size, quantize_embeddings)
        runs_as = formats(module, quantized)
    with files_beside(path):
        program, report = to_executorch(module, example_inputs, dynamic_shapes)
        result = write(program, report, path)
    result.quantized, result.formats = tuple(quantized), runs_as
    return result


