"""etmlx: export PyTorch models to ExecuTorch .pte files that run on Apple MLX.

``etmlx.load`` and the runtime need only mlx, flatbuffers and numpy; ``etmlx.export``
imports torch and executorch when it is called.
"""

from .errors import EtMlxError, ExportError
from .quiet import quiet_dependency_noise
from .runtime_shim.blas import preload_openblas

preload_openblas()  # must run before anything imports mlx; see runtime_shim/blas.py
quiet_dependency_noise()


def export(module, example_inputs, path, dynamic_shapes=None):
    from .exporter import export as _export

    return _export(module, example_inputs, path, dynamic_shapes=dynamic_shapes)


def export_methods(methods, path):
    from .exporter import export_methods as _export_methods

    return _export_methods(methods, path)


def load(path_or_bytes):
    from .runtime_shim import load as _load

    return _load(path_or_bytes)


__all__ = ["EtMlxError", "ExportError", "export", "export_methods", "load"]
