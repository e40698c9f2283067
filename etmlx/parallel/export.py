"""``etmlx.export(..., tensor_parallel=N)``: a directory of one program per rank, each
traced from that rank's shard of the model and checked against the whole model first."""

import dataclasses
import logging
import os
from dataclasses import dataclass

from etmlx.errors import ExportError, first_line
from etmlx.pipeline import lower_methods, write

from .ranks import write_manifest
from .shard_check import check_ranks
from .shard_plan import ShardPlan, find_blocks
from .sharding import shard

log = logging.getLogger("etmlx")


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
    shards, traced = _shards_that_trace(trace_methods, module, find_blocks(module, whole[first]), size)
    decisions = shards[0][1]
    check_ranks(whole[first], [methods[first] for methods in traced], first)
    quantized = [()] * size
    if quantize is not None:
        from etmlx.quant.weights import quantized_copy

        copies = [quantized_copy(sharded, *quantize) for sharded, _ in shards]
        traced = [trace_methods(copy) for copy, _ in copies]
        quantized = [tuple(names) for _, names in copies]
    os.makedirs(path, exist_ok=True)
    ranks = []
    for rank, methods in enumerate(traced):
        program, report = lower_methods(methods)
        ranks.append(write(program, report, os.path.join(path, f"rank{rank}.pte")))
        ranks[-1].quantized = quantized[rank]
    write_manifest(path, size, [str(d) for d in decisions])
    return TensorParallelResult(os.fspath(path), size, ranks, decisions)


def _shards_that_trace(trace_methods, module, plan: ShardPlan, size: int) -> tuple:
    """Each rank's (shard, decisions) of ``module`` and the shard's methods, traced.

    A model may derive its head layout from something sharding cannot follow: nanoGPT
    splits its stacked projection with ``split(self.n_embd)`` and views it with
    ``view(B, T, self.n_head, C // self.n_head)``, ``C`` read from its input. When a shard
    does not trace, every attention block stays whole on every rank, with a warning, and
    only the MLPs split: a tensor-parallel export does not fail where a plain one succeeds."""
    shards = [shard(module, plan, rank, size) for rank in range(size)]
    decisions = shards[0][1]
    if size > 1 and not any(d.sharded for d in decisions):
        found = "; ".join(map(str, decisions)) or "no attention call and no MLP in its graph"
        raise ExportError(f"tensor_parallel={size}: nothing of {type(module).__name__} splits over {size} ranks ({found})")
    try:
        return shards, [trace_methods(sharded) for sharded, _ in shards]
    except Exception as error:
        if all(block.problem for block in plan.attention):
            raise ExportError(f"tensor_parallel={size}: a rank's shard does not trace: {first_line(error)}") from error
        reason = f"its shard does not trace: {first_line(error)}"
        log.warning("tensor_parallel=%d: attention left whole on every rank (%s)", size, reason)
        whole_attention = [dataclasses.replace(block, problem=block.problem or reason) for block in plan.attention]
        return _shards_that_trace(trace_methods, module, ShardPlan(whole_attention, plan.mlps), size)
