"""etmlx: export PyTorch models to ExecuTorch .pte files that run on Apple MLX.

- ``export(module, example_inputs, path, ...)``: an ``nn.Module`` to a ``.pte``;
- ``export_methods({name: ExportedProgram}, path)``: several methods in one file;
- ``export_llm(checkpoint, path, ...)``: a causal LM in ExecuTorch's LLM-runner convention;
- ``load(path, runtime=...)``: a ``.pte`` to run, on etmlx's Python runtime or on
  ExecuTorch's C++ runtime with etmlx's native backend.

``import etmlx`` imports neither torch nor transformers: ``load`` needs only mlx,
flatbuffers and numpy, and the exports import torch and executorch when they are called
(transformers only for language models).
"""

from .errors import EtMlxError, ExportError
from .exporter import export, export_methods
from .llm.export import export_llm
from .loading import RUNTIMES, load_file
from .quiet import quiet_dependency_noise
from .runtime_shim.blas import preload_openblas

preload_openblas()  # must run before anything imports mlx; see runtime_shim/blas.py
quiet_dependency_noise()


def load(path_or_bytes, runtime: str = "python"):
    """Loads a ``.pte`` to run: ``runtime="python"`` (the default) with etmlx's own
    runtime, which needs only mlx, flatbuffers and numpy for a fully delegated program;
    ``runtime="executorch"`` with ExecuTorch's C++ runtime and etmlx's native backend
    (``etmlx.native``), the runtime an app embeds. Both take torch, numpy or mlx inputs
    and return outputs of the same kind.

    A directory written with ``tensor_parallel=N`` loads this process's rank of it, in a
    process group of N started by ``mlx.launch`` (``etmlx/parallel/ranks.py``)."""
    from .parallel.ranks import is_tensor_parallel

    if is_tensor_parallel(path_or_bytes):
        from .parallel.ranks import load as load_rank

        return load_rank(path_or_bytes, runtime)
    return load_file(path_or_bytes, runtime)


__all__ = ["RUNTIMES", "EtMlxError", "ExportError", "export", "export_llm", "export_methods", "load"]
