"""``etmlx.export(..., tensor_parallel=N)``: a directory of one program per rank, each
traced from that rank's shard of the model and checked against the whole model first."""

import os
from dataclasses import dataclass

from etmlx.errors import ExportError
from etmlx.pipeline import lower_methods, write

from .ranks import write_manifest
from .shard_check import check_ranks
from .shard_plan import find_blocks
from .sharding import shard


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
    the blocks that split (``etmlx/parallel/shard_plan.py``) and as the reference, then per rank's
    shard (``etmlx/parallel/sharding.py``); the ranks' first methods, run together in eager, must
    compute the whole model's (``etmlx/parallel/shard_check.py``). ``quantize``: (scheme,
    group_size, embeddings) of ``quantized_copy``, applied to each rank's shard after that
    check (the shards are traced again, quantized)."""
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
        from etmlx.quant.weights import quantized_copy

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
