"""etmlx: export PyTorch models to ExecuTorch .pte files that run on Apple MLX.

``etmlx.load`` and the runtime need only mlx, flatbuffers and numpy; ``etmlx.export``
imports torch and executorch when it is called.
"""

from .errors import EtMlxError, ExportError
from .loading import RUNTIMES, load_file
from .quiet import quiet_dependency_noise
from .runtime_shim.blas import preload_openblas

preload_openblas()  # must run before anything imports mlx; see runtime_shim/blas.py
quiet_dependency_noise()


def export(
    module, example_inputs, path, dynamic_shapes=None, quantize=None, group_size=64, quantize_embeddings=True,
    tensor_parallel=None,
):
    from .exporter import export as _export

    return _export(module, example_inputs, path, dynamic_shapes, quantize, group_size, quantize_embeddings, tensor_parallel)


def export_methods(methods, path, tensor_parallel=None, model=None):
    from .exporter import export_methods as _export_methods

    return _export_methods(methods, path, tensor_parallel, model)


def export_llm(model_dir, output, max_context=None, max_seq_len=128, quantize=None, group_size=64, dtype=None,
               sample_on_device=False, kv_bits=None, kv_group_size=64, progress=None):
    """A Hugging Face causal-LM checkpoint folder (or Hub id, or GGUF file) to a ``.pte`` in
    ExecuTorch's LLM-runner convention, its tokenizer files beside it; the options are
    ``etmlx export-llm``'s (``etmlx/llm_export.py``). ``dtype`` defaults to the
    checkpoint's, whose files are then read in place."""
    from .llm_export import export_llm as _export_llm

    return _export_llm(model_dir, output, max_context=max_context, max_seq_len=max_seq_len, quantize=quantize,
                       group_size=group_size, dtype=dtype, sample_on_device=sample_on_device, kv_bits=kv_bits,
                       kv_group_size=kv_group_size, progress=progress)


def load(path_or_bytes, runtime: str = "python"):
    """Loads a ``.pte`` to run: ``runtime="python"`` (the default) with etmlx's own
    runtime, which needs only mlx, flatbuffers and numpy for a fully delegated program;
    ``runtime="executorch"`` with ExecuTorch's C++ runtime and etmlx's native backend
    (``etmlx.native``), the runtime an app embeds. Both take torch, numpy or mlx inputs
    and return outputs of the same kind.

    A directory written with ``tensor_parallel=N`` loads this process's rank of it, in a
    process group of N started by ``mlx.launch`` (``etmlx/tensor_parallel.py``)."""
    from .tensor_parallel import is_tensor_parallel

    if is_tensor_parallel(path_or_bytes):
        from .tensor_parallel import load as load_rank

        return load_rank(path_or_bytes, runtime)
    return load_file(path_or_bytes, runtime)


__all__ = ["RUNTIMES", "EtMlxError", "ExportError", "export", "export_llm", "export_methods", "load"]
