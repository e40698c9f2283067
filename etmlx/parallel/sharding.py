"""Shards a module for tensor parallelism (``etmlx/parallel/ranks.py``): one copy per
rank of the blocks ``etmlx/parallel/shard_plan.py`` found, which ``etmlx/parallel/export.py`` traces,
checks against the whole model (``etmlx/parallel/shard_check.py``) and writes.

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
from dataclasses import dataclass

import torch

from etmlx.lowering import custom_ops  # noqa: F401  (registers etmlx::all_sum)
from .shard_plan import Attention, Mlp, ShardPlan


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


class RowParallel(torch.nn.Linear):
    """A Linear over input columns [start, stop): this rank's partial product, summed
    across ranks, then the bias (once). A Linear, so that ``quantize=`` quantizes it."""

    def __init__(self, linear: torch.nn.Linear, start: int, stop: int):
        super().__init__(stop - start, linear.out_features, bias=linear.bias is not None,
                         device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            self.weight.copy_(linear.weight[:, start:stop])
            if linear.bias is not None:
                self.bias.copy_(linear.bias)

    def forward(self, x):
        out = torch.ops.etmlx.all_sum(torch.nn.functional.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


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


def _rank_block(count: int, width: int, rank: int, size: int, offset: int = 0) -> tuple:
    """Rank ``rank``'s (start, stop) of ``count`` units of ``width`` values starting at ``offset``."""
    per_rank = count // size * width
    return offset + rank * per_rank, offset + (rank + 1) * per_rank


def _replace(model, path: str, module) -> None:
    owner, _, name = path.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, name, module)


# Head counts a module may keep for its own reshapes; each is divided by the number of
# ranks where its value is the block's (query or key/value heads, or their total width).
HEAD_COUNT_ATTRIBUTES = ("heads", "num_heads", "n_heads", "n_head", "num_attention_heads", "num_key_value_heads",
                         "num_kv_heads", "n_kv_heads", "all_head_size", "inner_dim")


def _shard_attention(model, block: Attention, rank: int, size: int) -> str:
    """Heads per rank (query and key/value heads each split), or why not."""
    if block.problem:
        return block.problem
    if block.heads % size or block.kv_heads % size:
        heads = f"{block.heads} heads" if block.heads == block.kv_heads else f"{block.heads} query and {block.kv_heads} key/value heads"
        return f"{heads} do not split over {size} ranks"
    queries = _rank_block(block.heads, block.head_dim, rank, size)
    keys = _rank_block(block.kv_heads, block.head_dim, rank, size, block.heads * block.head_dim if block.stacked else 0)
    values = _rank_block(block.kv_heads, block.value_dim, rank, size,
                         block.heads * block.head_dim + block.kv_heads * block.head_dim if block.stacked else 0)
    if block.stacked:
        _replace(model, block.q, _column_parallel(model.get_submodule(block.q), [queries, keys, values]))
    else:
        for path, rows in ((block.q, queries), (block.k, keys), (block.v, values)):
            _replace(model, path, _column_parallel(model.get_submodule(path), [rows]))
    _replace(model, block.out, RowParallel(model.get_submodule(block.out), *_rank_block(block.heads, block.value_dim, rank, size)))
    owner = model.get_submodule(block.module) if block.module else model
    counts = {block.heads, block.kv_heads, block.heads * block.head_dim, block.heads * block.value_dim}
    for name in HEAD_COUNT_ATTRIBUTES:
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value in counts:
            setattr(owner, name, value // size)
    return ""


def _shard_mlp(model, block: Mlp, rank: int, size: int) -> str:
    if block.hidden % size:
        return f"hidden size {block.hidden} does not split over {size} ranks"
    columns = _rank_block(block.hidden, 1, rank, size)
    for path in block.ups:
        _replace(model, path, _column_parallel(model.get_submodule(path), [columns]))
    _replace(model, block.down, RowParallel(model.get_submodule(block.down), *columns))
    return ""


def shard(module, plan: ShardPlan, rank: int, size: int) -> tuple:
    """A copy of ``module`` holding rank ``rank``'s shard of ``size`` of the blocks in
    ``plan``, and the decision for each block. A transformers model's config follows its
    heads (its KV cache is sized from it) when every attention block was sharded."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} of {size}")
    sharded = copy.deepcopy(module)
    decisions = []
    for block in plan.blocks:
        if isinstance(block, Attention):
            decisions.append(ShardDecision(block.module, "attention", _shard_attention(sharded, block, rank, size)))
        else:
            decisions.append(ShardDecision(block.module, "mlp", _shard_mlp(sharded, block, rank, size)))
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
