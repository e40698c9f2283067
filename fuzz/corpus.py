"""The programs the fuzzer mutates: small exported models that between them have every
part of a .pte a reader must check — static and dynamic shapes, mutable buffers, a
bounds-checked index input, partial delegation (two payloads around a declined call),
quantized weights (affine and a float mode), sorting and scattering, rotary embeddings,
keyed random numbers, KV caches that grow, recurrent states (the gated delta rule), and a
saved prompt of them."""

import dataclasses
import pathlib

import numpy as np
import torch

import etmlx
import etmlx.lowering.custom_ops  # noqa: F401  (registers torch.ops.etmlx.*)
from etmlx.llm import prompt_cache
from etmlx.quant.weights import quantized_copy
from etmlx.pipeline import trace
from etmlx.parallel.shard_plan import find_blocks
from etmlx.parallel.sharding import shard
from examples import llm, models


@dataclasses.dataclass
class Entry:
    name: str
    pte: bytes
    inputs: list  # numpy arrays that run the original program
    method: str = "forward"
    prompt_cache: bytes = b""  # for a language model: its KV cache after those inputs (etmlx.llm.prompt_cache)


class _Counter(torch.nn.Module):
    """Token ids into an embedding, and a buffer counting the calls."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, ids):
        self.calls.add_(1)
        return self.embed(ids).sum(-1) + self.calls


class _PartlyDelegated(torch.nn.Module):
    """A float64 op, which MLX declines, between two delegated regions."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.second(torch.exp(self.first(x).double()).float())


class _QuantizedLookup(torch.nn.Module):
    """Token ids into an embedding, then a linear layer: both quantized (packed uint32 weights)."""

    def __init__(self, outputs: int = 8):
        super().__init__()
        self.embed, self.project = torch.nn.Embedding(16, 64), torch.nn.Linear(64, outputs)

    def forward(self, ids):
        return self.project(self.embed(ids))


class _SortsAndScatters(torch.nn.Module):
    """Sorted and top-k values, scatters (add, max) by run-time indices, elementwise math."""

    def forward(self, x, index):
        ordered = torch.sort(x, dim=-1, descending=True).values + torch.topk(x, 2).values.sum(-1, keepdim=True)
        spread = torch.zeros(x.shape[0], 8).scatter_add(1, index, x[:, : index.shape[1]])
        peaks = x.scatter_reduce(1, index % x.shape[1], x, "amax", include_self=False)
        return ordered.atan2(x.round()), spread.isnan(), torch.div(x, 3, rounding_mode="trunc"), peaks


class Rotary(torch.nn.Module):
    """Rotary embeddings as transformers writes them (one Rope node): query rows rotated
    at positions ``start + arange(T)``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1 / 10000 ** (torch.arange(0, 8, 2).float() / 8))

    def forward(self, q, start):
        freqs = (torch.arange(q.shape[-2]) + start)[None, :, None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return q * angles.cos()[:, None] + torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * angles.sin()[:, None]


class Experts(torch.nn.Module):
    """A mixture of experts as transformers' ``batched_mm`` computes it: each token's top-2
    experts' weights gathered, one matmul per token and expert, in both orientations
    (two GatherMm nodes, an ArgSort; GatherQmm once ``quantized_copy`` quantized the
    stacks, which it finds by transformers' names and ``has_gate``). The router runs in
    float32, as transformers' do: in half precision its probabilities tie often, and
    PyTorch orders ties its own way."""

    has_gate = False

    def __init__(self, experts=4, dim=16, hidden=24):
        super().__init__()
        self.router = torch.nn.Linear(dim, experts, bias=False)
        self.up_proj = torch.nn.Parameter(torch.randn(experts, hidden, dim) / 4)  # (E, out, in)
        self.down_proj = torch.nn.Parameter(torch.randn(experts, hidden, dim) / 4)  # (E, in, out)

    def forward(self, x):
        weights, chosen = torch.topk(self.router(x).float().softmax(-1), 2)
        ids = chosen.reshape(-1)
        tokens = x.unsqueeze(1).expand(-1, 2, -1).reshape(-1, x.shape[-1])
        h = torch.bmm(self.up_proj[ids], tokens.unsqueeze(-1)).squeeze(-1).relu()  # W[ids] @ x
        out = torch.bmm(h.unsqueeze(1), self.down_proj[ids]).squeeze(1)  # x @ W[ids]
        return (out.view(-1, 2, x.shape[-1]) * weights.to(x.dtype).unsqueeze(-1)).sum(1)


class _KeyedNoise(torch.nn.Module):
    """Noise drawn by MLX's generator keyed by a seed input (what ``mlx::sample`` draws)."""

    def forward(self, x, seed):
        return x + torch.ops.etmlx.random_uniform(seed, [x.shape[0], x.shape[1]])


def _factories():
    mlp, mlp_inputs, _ = models.mlp()
    block, block_inputs, block_dynamic = models.encoder_block_dynamic_seq()
    yield "mlp", mlp, mlp_inputs, None
    yield "encoder_block_dynamic_seq", block, block_inputs, block_dynamic
    yield "counter_embedding", _Counter(), (torch.tensor([[1, 2, 3]]),), None
    yield "partly_delegated", _PartlyDelegated(), (torch.randn(3, 8),), None
    yield "quantized_int4", quantized_copy(_QuantizedLookup(), "int4", 32)[0], (torch.tensor([[1, 5, 15]]),), None
    # MLX's float modes (no biases; nvfp4's per-tensor scale a Mul): the rows of 16 take both
    yield "quantized_nvfp4", quantized_copy(_QuantizedLookup(16), "nvfp4")[0], (torch.tensor([[1, 5, 15]]),), None
    yield "sorts_and_scatters", _SortsAndScatters(), (torch.randn(3, 6), torch.tensor([[0, 7, 7]] * 3)), None
    yield "rotary", Rotary(), (torch.randn(1, 2, 3, 8), torch.tensor([5])), None
    yield "experts", Experts(), (torch.randn(5, 16),), None
    yield "keyed_noise", _KeyedNoise(), (torch.randn(3, 8), torch.tensor(5)), None
    yield "quantized_experts", quantized_copy(Experts(dim=32), "int4", 32)[0], (torch.randn(5, 32),), None
    # rank 0's shard of 2 (AllSum nodes): run in a process group of one, where the sum is x
    yield "tensor_parallel_rank", shard(block, find_blocks(block, trace(block, block_inputs)), 0, 2)[0], block_inputs, None
    # a causal LM's methods (a dict: etmlx.export_methods): KV caches that grow in windows of 8
    language_model = llm.tiny_llama(hidden=32, layers=1, max_cache=32)
    yield "growing_kv_cache", llm.export_methods(language_model, 4, window_step=8), (
        torch.tensor([[1, 2, 3]]), torch.arange(3)), None
    # its cache quantized to 4 bits (Quantize, QuantizedMatmul over int32 words): heads of 32
    yield "quantized_kv_cache", llm.export_methods(llm.tiny_llama(hidden=128, layers=1, max_cache=32), 4,
                                                   window_step=8, kv_bits=4, kv_group_size=32), (
        torch.tensor([[1, 2, 3]]), torch.arange(3)), None
    # recurrent states beside a KV cache (GatedDelta, convolution windows): Qwen3.5's layers
    yield "recurrent_states", llm.export_methods(llm.tiny_hybrid("qwen3_5", max_cache=32), 4, window_step=8), (
        torch.tensor([[1, 2, 3]]), torch.arange(3)), None
    # Mamba's selective scan (SelectiveScan) from a stored state
    yield "selective_scan", llm.export_methods(llm.tiny_hybrid("mamba", max_cache=32), 4), (
        torch.tensor([[1, 2, 3]]), torch.arange(3)), None


def build(directory: pathlib.Path) -> list:
    """Exports every corpus model into ``directory`` (once; reused when present)."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    torch.manual_seed(0)
    for name, module, inputs, dynamic_shapes in _factories():
        path = directory / f"{name}.pte"
        if not path.exists() and isinstance(module, dict):
            etmlx.export_methods(module, path)
        elif not path.exists():
            etmlx.export(module, inputs, path, dynamic_shapes=dynamic_shapes)
        arrays = [np.asarray(x.numpy()) for x in inputs]
        saved = path.with_suffix(".kv")
        if isinstance(module, dict) and not saved.exists():
            program = etmlx.load(path)
            program.forward(*arrays)
            prompt_cache.save(program, saved, [int(t) for t in arrays[0][0]])
        kept = saved.read_bytes() if saved.exists() else b""
        entries.append(Entry(name, path.read_bytes(), arrays, prompt_cache=kept))
    return entries
