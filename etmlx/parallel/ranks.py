"""Tensor parallelism: one model run by N processes (``mlx.launch -n N``), each holding
1/N of the attention and MLP weights, joined by MLX's distributed layer.

``etmlx.export(..., tensor_parallel=N)`` shards the model per rank (``etmlx/parallel/sharding.py``)
and writes each rank's program as its own ``.pte`` in one directory, with a manifest, so a
rank reads only its own shard. ``etmlx.load(directory)`` (here: mlx only) joins the
process group, checks its size and loads ``rank<r>.pte``.
"""

import json
import math
import os
import sys
import threading
import time

from etmlx.errors import EtMlxError
from etmlx.runtime_shim.program import MethodCalls

MANIFEST = "tensor_parallel.json"
TIMEOUT_VARIABLE = "ETMLX_DISTRIBUTED_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0


def is_tensor_parallel(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and os.path.isfile(os.path.join(path, MANIFEST))


def manifest(path) -> dict:
    """The directory's manifest, checked: ``size`` ranks, one plain file name each."""
    where = os.path.join(path, MANIFEST)
    try:
        with open(where) as f:
            content = json.load(f)
        size, ranks = content["size"], content["ranks"]
    except (ValueError, KeyError, TypeError) as error:
        raise EtMlxError(f"{where} is damaged: {error}") from None
    valid_size = isinstance(size, int) and not isinstance(size, bool) and size >= 1
    if not valid_size or not isinstance(ranks, list) or len(ranks) != size or not all(
        isinstance(name, str) and name and os.path.basename(name) == name and name not in (".", "..") for name in ranks
    ):
        raise EtMlxError(f"{where} is damaged: expected a size of 1 or more and that many file names in this directory")
    return content


def write_manifest(path, size: int, blocks: list) -> None:
    """``path``'s manifest: ``size`` ranks, each in ``rank<r>.pte``, and the per-block decisions."""
    content = {"size": size, "ranks": [f"rank{r}.pte" for r in range(size)], "blocks": blocks}
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump(content, f, indent=1)


def rank_file(path, rank: int) -> str:
    return os.path.join(path, manifest(path)["ranks"][rank])


def load(path, runtime: str):
    """This process's rank of the program in directory ``path``: joins MLX's process group
    (``mx.distributed.init``; ``mlx.launch`` starts the ranks), checks its size, and loads
    only this rank's file. Calls are watched: see ``Watched``."""
    import mlx.core as mx

    from etmlx.loading import load_file

    size = manifest(path)["size"]
    group = mx.distributed.init()
    if group.size() != size:
        raise EtMlxError(
            f"{path} was exported for {size} ranks, but this process group has {group.size()}: "
            f"start it with `mlx.launch -n {size} ...` (or --hosts with {size} hosts)"
        )
    program = load_file(rank_file(path, group.rank()), runtime)
    return Watched(program, group.rank(), size, _timeout())


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_VARIABLE, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise EtMlxError(f"{TIMEOUT_VARIABLE}={text!r}: expected seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise EtMlxError(f"{TIMEOUT_VARIABLE}={text!r}: expected seconds, more than 0")
    return value


def _abort(rank: int, size: int, method: str, seconds: float) -> None:
    sys.stderr.write(
        f"etmlx: rank {rank} of {size}: method '{method}' did not finish within {seconds:g} s; the other ranks "
        f"did not answer (did one stop?). Exiting ({TIMEOUT_VARIABLE} sets the limit).\n"
    )
    sys.stderr.flush()
    os._exit(75)


class Watched(MethodCalls):
    """A rank's program whose calls must finish within a time limit: a sum across ranks
    waits for every rank, and MLX's ring backend waits forever for one that stopped
    answering, so past the limit the process exits with a message instead of hanging.

    One watcher thread per program looks at the running call's deadline once a second, so
    a call only writes its deadline (a thread started per call cost ~190 us here)."""

    POLL_S = 1.0

    def __init__(self, program, rank: int, size: int, timeout_s: float):
        self.program, self.rank, self.size, self.timeout_s = program, rank, size, timeout_s
        self._running = None  # (method name, deadline) of the call in progress
        threading.Thread(target=self._watch, name="etmlx-rank-watcher", daemon=True).start()

    @property
    def method_names(self) -> list:
        return self.program.method_names

    def run_method(self, name, inputs):
        self._running = (name, time.monotonic() + self.timeout_s)
        try:
            return self.program.run_method(name, inputs)
        finally:
            self._running = None

    def _watch(self) -> None:
        while True:
            time.sleep(self.POLL_S)
            running = self._running
            if running is not None and time.monotonic() > running[1]:
                _abort(self.rank, self.size, running[0], self.timeout_s)
