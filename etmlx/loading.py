"""One ``.pte`` loaded on the runtime asked for; ``etmlx.load`` (and each rank of a
tensor-parallel directory) comes here."""

RUNTIMES = ("python", "executorch")


def load_file(path_or_bytes, runtime: str):
    """``runtime="python"``: etmlx's own runtime (``runtime_shim/``); ``"executorch"``:
    ExecuTorch's C++ runtime with etmlx's native backend (``native/``)."""
    if runtime == "python":
        from .runtime_shim import load

        return load(path_or_bytes)
    if runtime == "executorch":
        from .native import load

        return load(path_or_bytes)
    raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
