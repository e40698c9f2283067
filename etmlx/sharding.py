"""Shards a module for tensor parallelism (``etmlx/tensor_parallel.py``) and writes one
program per rank.

The standard split (Megatron's, mlx-lm's): an attention block's q/k/v projections and an
MLP's gate/up projections are split by output rows (column-parallel: each rank computes
its own heads, its own slice of the hidden layer), its output and down projections by
input columns (row-parallel: each rank's partial product, summed across ranks by
``etmlx::all_sum`` -> IR ``AllSum`` -> ``mx.distributed.all_sum``, then the bias). Heads,
and with them the KV cache, split by head. Everything else (embeddings, norms, the LM
head) is replicated. A block whose heads or hidden size do not divide by the number of
ranks stays whole on every rank, with the reason.
"""

import copy
import json
import os
from dataclasses import dataclass

import torch

from .errors import ExportError
from .lowering import custom_ops  # noqa: F401  (registers etmlx::all_sum)
from .tensor_parallel import MANIFEST


@dataclass(frozen=True)
class ShardDecision:
    """What happened to one block: ``sharded``, or why it stayed whole (replicated)."""

    module: str  # its path in the model, "" for the root
    kind: str  # "attention" or "mlp"
    reason: str = ""  # empty when sharded

    @property
    def sharded(self) -> bool:
        return not self.reason

    def __str__(self) -> str:
        where = self.module or "(root)"
        return f"{where} {self.kind}: " + ("sharded" if self.sharded else f"replicated ({self.reason})")


class RowParallel(torch.nn.Module):
    """A Linear over input columns [start, stop): this rank's partial product, summed
    across ranks, then the bias (once)."""

    def __init__(self, linear: torch.nn.Linear, start: int, stop: int):
        super().__init__()
        self.weight = torch.nn.Parameter(linear.weight[:, start:stop].detach().clone(), requires_grad=False)
        bias = linear.bias
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x):
        out = torch.ops.etmlx.all_sum(torch.nn.functional.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


def _linear(module, *names):
    """The first child named in ``names`` that is an ``nn.Linear``, else None."""
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, torch.nn.Linear):
            return name
    return None


def _column_parallel(linear, blocks: list):
    """A Linear computing only the output rows ``blocks`` ([(start, stop), ...])."""
    rows = torch.cat([torch.arange(start, stop) for start, stop in blocks])
    shard = torch.nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None)
    shard = shard.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        shard.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            shard.bias.copy_(linear.bias[rows])
    return shard


def _head_blocks(heads: int, head_dim: int, rank: int, size: int, offset: int = 0) -> list:
    per_rank = heads // size
    start = offset + rank * per_rank * head_dim
    return [(start, start + per_rank * head_dim)]


def _shard_attention(module, rank: int, size: int):
    """Separate q/k/v/o projections (transformers' attention): heads per rank, or the
    reason not. Needs ``head_dim``; k and v may have fewer heads (grouped-query)."""
    head_dim = getattr(module, "head_dim", None)
    if not isinstance(head_dim, int):
        return "no integer head_dim attribute"
    heads, kv_heads = module.q_proj.out_features // head_dim, module.k_proj.out_features // head_dim
    if heads % size or kv_heads % size:
        return f"{heads} query and {kv_heads} key/value heads do not split over {size} ranks"
    module.q_proj = _column_parallel(module.q_proj, _head_blocks(heads, head_dim, rank, size))
    module.k_proj = _column_parallel(module.k_proj, _head_blocks(kv_heads, head_dim, rank, size))
    module.v_proj = _column_parallel(module.v_proj, _head_blocks(kv_heads, head_dim, rank, size))
    (start, stop), = _head_blocks(heads, head_dim, rank, size)
    module.o_proj = RowParallel(module.o_proj, start, stop)
    return None


def _shard_fused_attention(module, rank: int, size: int):
    """One ``qkv`` projection (q, k, v stacked by rows) and ``proj``, with ``heads`` and
    ``head_dim`` attributes, as the example encoder block writes attention."""
    heads, head_dim = getattr(module, "heads", None), getattr(module, "head_dim", None)
    if not isinstance(heads, int) or not isinstance(head_dim, int) or module.qkv.out_features != 3 * heads * head_dim:
        return "no heads and head_dim attributes that match its qkv projection"
    if heads % size:
        return f"{heads} heads do not split over {size} ranks"
    width = heads * head_dim
    blocks = [block for part in range(3) for block in _head_blocks(heads, head_dim, rank, size, part * width)]
    module.qkv = _column_parallel(module.qkv, blocks)
    (start, stop), = _head_blocks(heads, head_dim, rank, size)
    module.proj = RowParallel(module.proj, start, stop)
    module.heads = heads // size
    return None


def _shard_mlp(module, rank: int, size: int, names: tuple):
    gate, up, down = names
    hidden = getattr(module, up).out_features
    if hidden % size:
        return f"hidden size {hidden} does not split over {size} ranks"
    block = [(rank * hidden // size, (rank + 1) * hidden // size)]
    for name in (gate, up):
        if name is not None:
            setattr(module, name, _column_parallel(getattr(module, name), block))
    setattr(module, down, RowParallel(getattr(module, down), *block[0]))
    return None


def _blocks(module):
    """(kind, shard function) for each shardable block ``module`` is."""
    if all(_linear(module, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")):
        yield "attention", _shard_attention
    elif _linear(module, "qkv") and _linear(module, "proj"):
        yield "attention", _shard_fused_attention
    up, down = _linear(module, "up_proj", "up"), _linear(module, "down_proj", "down")
    if up and down:
        names = (_linear(module, "gate_proj", "gate"), up, down)
        yield "mlp", lambda m, rank, size: _shard_mlp(m, rank, size, names)


def shard(module, rank: int, size: int) -> tuple:
    """A copy of ``module`` holding rank ``rank``'s shard of ``size``, and the decision for
    each block. A transformers model's config follows its heads (its KV cache is sized
    from it) when every attention block was sharded."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} of {size}")
    sharded = copy.deepcopy(module)
    decisions = []
    for path, block in list(sharded.named_modules()):
        for kind, shard_block in _blocks(block):
            decisions.append(ShardDecision(path, kind, shard_block(block, rank, size) or ""))
    _shard_config(sharded, decisions, size)
    return sharded, decisions


def _shard_config(model, decisions: list, size: int) -> None:
    config = getattr(model, "config", None)
    attention = [d for d in decisions if d.kind == "attention"]
    if config is None or not attention or not all(d.sharded for d in attention):
        return
    heads = config.num_attention_heads
    config.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    config.num_attention_heads = heads // size
    config.num_key_value_heads = (getattr(config, "num_key_value_heads", None) or heads) // size


@dataclass
class TensorParallelResult:
    path: str  # the directory
    size: int
    ranks: list  # ExportResult per rank
    decisions: list  # ShardDecision, the same on every rank

    @property
    def report(self):
        return self.ranks[0].report


def export_ranks(path, size: int, lower_rank, module) -> TensorParallelResult:
    """Writes ``path/rank<r>.pte`` for each rank, ``lower_rank(sharded_module)`` giving the
    (program, report) of one, and the manifest."""
    from .exporter import write

    if not isinstance(size, int) or size < 1:
        raise ExportError(f"tensor_parallel={size!r}: expected a number of ranks, 1 or more")
    os.makedirs(path, exist_ok=True)
    ranks, decisions = [], []
    for rank in range(size):
        sharded, decisions = shard(module, rank, size)
        if size > 1 and not any(d.sharded for d in decisions):
            found = "; ".join(map(str, decisions)) or "no attention block with q_proj/k_proj/v_proj/o_proj or qkv/proj, " \
                "no MLP with up/down projections"
            raise ExportError(f"tensor_parallel={size}: nothing of {type(module).__name__} splits over {size} ranks ({found})")
        program, report = lower_rank(sharded)
        ranks.append(write(program, report, os.path.join(path, f"rank{rank}.pte")))
    manifest = {"size": size, "ranks": [f"rank{r}.pte" for r in range(size)], "blocks": [str(d) for d in decisions]}
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return TensorParallelResult(os.fspath(path), size, ranks, decisions)
