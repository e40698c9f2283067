"""Models prepared for ExecuTorch's own MLX delegate (its ``mlx::`` custom ops) export
fully delegated and compute what those ops' reference kernels do, on both runtimes:
rotary embeddings, a KV cache written in place (linear and ring; also in the
functionalized form a program takes when its decompositions ran first) and attention
over it, carried across calls, experts' matmuls, on-device sampling (its distribution
and its seed)."""

import copy

import pytest
import torch
import upstream_ops  # noqa: F401  (defines torch.ops.mlx.*)
from lowering_harness import assert_close, lower, lower_exported, tensor_kernels
from torch.export import Dim

import etmlx
from etmlx.errors import ExportError

mlx = torch.ops.mlx
# Outside MLX by design: the position read from its tensor, and sizes, on the host.
HOST_READS = {"aten::_local_scalar_dense.default", "aten::sym_size.int"}


class Rotary(torch.nn.Module):
    def __init__(self, dims, traditional=False, freqs=None, scale=1.0):
        super().__init__()
        self.dims, self.traditional, self.scale = dims, traditional, scale
        self.freqs = freqs

    def forward(self, x, pos):
        start = pos.item()
        torch._check(start >= 0)
        torch._check(start <= 4096)
        return mlx.rope(x, self.dims, start, self.traditional, 10000.0, self.scale, self.freqs)


@pytest.mark.parametrize(
    "dims,traditional,freqs,dtype",
    [(16, False, None, torch.float32), (8, True, None, torch.float32), (16, False, "given", torch.float32),
     (12, False, None, torch.bfloat16)],
    ids=["split-half", "traditional-partial", "given-freqs", "bf16-partial"],
)
def test_rope_equals_its_reference(dims, traditional, freqs, dtype):
    freqs = torch.linspace(1.0, 900.0, dims // 2) if freqs else None
    module = Rotary(dims, traditional, freqs, scale=0.5)
    x = torch.randn(1, 2, 5, 16).to(dtype)
    lowered = lower(module, (x, torch.tensor(3)), dynamic_shapes=({2: Dim("t", min=1, max=32)}, None))
    assert set(tensor_kernels(lowered.kernels)) <= HOST_READS and len(lowered.delegates) == 1
    for length, start in ((5, 3), (1, 2000), (7, 0)):
        x = torch.randn(1, 2, length, 16).to(dtype)
        assert_close(lowered.program.forward(x, torch.tensor(start)), module(x, torch.tensor(start)))


class CachedAttention(torch.nn.Module):
    """Keys and values written into caches of 32 slots, then attention of the new queries
    over the filled part, causally: the upstream delegate's LLM attention."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, 2, 32, 8))
        self.register_buffer("v_cache", torch.zeros(1, 2, 32, 8))

    def forward(self, q, k, v, pos):
        start = pos.item()
        torch._check(start >= 0)
        torch._check(start + q.shape[2] <= 32)
        mlx.kv_cache_update(self.k_cache, k, start)
        mlx.kv_cache_update(self.v_cache, v, start)
        return mlx.custom_sdpa(q, self.k_cache, self.v_cache, start, is_causal=True)


class Ring(torch.nn.Module):
    """Values written into a ring of 8 slots (sliding-window layers' cache): 11
    positions wrap around it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ring", torch.zeros(1, 2, 8, 8))

    def forward(self, q, k, v, pos):
        start = pos.item()
        torch._check(start >= 0)
        mlx.kv_cache_update(self.ring, v, start, 8)
        return self.ring + 0


def _steps():
    torch.manual_seed(0)
    lengths = (6, 1, 1, 3)
    position, steps = 0, []
    for n in lengths:
        steps.append((torch.randn(1, 4, n, 8), torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8), torch.tensor(position)))
        position += n
    return steps


def _lowered_functionalized(module, inputs, dynamic_shapes):
    """``module`` exported, its decompositions run before etmlx sees it (as upstream's
    examples do): the cache writes are ``auto_functionalized_v2`` calls then."""
    program = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes).run_decompositions({})
    assert any(node.target is torch.ops.higher_order.auto_functionalized_v2 for node in program.graph.nodes)
    return lower_exported(program)


@pytest.mark.parametrize("functionalized", [False, True], ids=["in-place", "functionalized"])
@pytest.mark.parametrize("model", [CachedAttention, Ring])
def test_a_cache_written_in_place_carries_across_calls(model, functionalized):
    module = model()
    eager = copy.deepcopy(module)
    steps = _steps()
    seq = Dim("seq", min=1, max=7)
    shapes = ({2: seq}, {2: seq}, {2: seq}, None)
    lowered = _lowered_functionalized(module, steps[0], shapes) if functionalized else lower(module, steps[0], shapes)
    assert set(tensor_kernels(lowered.kernels)) <= HOST_READS and len(lowered.delegates) == 1
    assert "IndexPut" in lowered.nodes and ("Sdpa" in lowered.nodes) == (model is CachedAttention)
    buffers = {b["name"] for d in lowered.delegates for b in d["buffers"]}
    assert buffers == set(dict(module.named_buffers())), buffers  # the caches are MLX's, updated in place
    program = lowered.program
    for step in steps:
        assert_close(program.forward(*step), eager(*step))


class DeltaRule(torch.nn.Module):
    """Qwen3.5's linear attention as the upstream delegate's examples write it: the rule
    over a state buffer the op updates in place (2 key heads, 4 value heads)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(1, 4, 8, 16))

    def forward(self, q, k, v, g, beta):
        return mlx.gated_delta_rule(q, k, v, g, beta, self.state) * 2


@pytest.mark.parametrize("functionalized", [False, True], ids=["in-place", "functionalized"])
def test_the_gated_delta_rule_carries_its_state_across_calls(functionalized):
    module = DeltaRule()
    eager = copy.deepcopy(module)
    torch.manual_seed(0)
    calls = [(torch.nn.functional.normalize(torch.randn(1, n, 2, 16), dim=-1),
              torch.nn.functional.normalize(torch.randn(1, n, 2, 16), dim=-1), torch.randn(1, n, 4, 8),
              torch.rand(1, n, 4), torch.rand(1, n, 4)) for n in (5, 1, 3)]
    seq = Dim("seq", min=1, max=16)
    shapes = ({1: seq},) * 5
    lowered = _lowered_functionalized(module, calls[0], shapes) if functionalized else lower(module, calls[0], shapes)
    assert lowered.kernels == [] and lowered.nodes.count("GatedDelta") == 2
    assert {b["name"] for d in lowered.delegates for b in d["buffers"]} == {"state"}
    program = lowered.program
    for call in calls:
        assert_close(program.forward(*call), eager(*call))


class Experts(torch.nn.Module):
    """Each token's vector times the matrix of the expert a router chose for it."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(16, 4)
        self.experts = torch.nn.Parameter(torch.randn(4, 16, 24))

    def forward(self, x):  # x: [tokens, 1, 16]
        chosen = self.router(x[:, 0]).topk(1).indices[:, 0]  # in range by construction
        return mlx.gather_mm(x, self.experts, chosen)


def test_gather_mm_equals_its_reference():
    module, x = Experts(), torch.randn(6, 1, 16)
    lowered = lower(module, (x,), dynamic_shapes=({0: Dim("tokens", min=1, max=64)},))
    assert tensor_kernels(lowered.kernels) == [] and "GatherMm" in lowered.nodes
    for tokens in (6, 1, 9):
        x = torch.randn(tokens, 1, 16)
        assert_close(lowered.program.forward(x), module(x))


class RoutedExperts(torch.nn.Module):
    """The upstream delegate's mixture of experts: tokens gathered per chosen expert
    (top 2 of 4), one gather_mm, the outputs scattered back and weighted."""

    def __init__(self, sort_cutoff: int):
        super().__init__()
        self.sort_cutoff = sort_cutoff
        self.router = torch.nn.Linear(16, 4)
        self.experts = torch.nn.Parameter(torch.randn(4, 16, 24))

    def forward(self, x):  # x: [tokens, 16]
        weights, chosen = self.router(x).softmax(-1).topk(2)
        x_input, idx, sort_experts, inv_order = mlx.moe_gather_inputs(x, chosen, 2, self.sort_cutoff)
        down = mlx.gather_mm(x_input, self.experts, idx)
        return (mlx.moe_scatter_outputs(down, sort_experts, inv_order, 2) * weights.unsqueeze(-1)).sum(1)


@pytest.mark.parametrize("sort_cutoff", [0, 64], ids=["sorted", "unsorted"])
def test_moe_gather_and_scatter_equal_their_reference(sort_cutoff):
    """Whichever branch the upstream reference takes (sorted past ``sort_cutoff`` tokens),
    etmlx's one form gives its outputs."""
    module = RoutedExperts(sort_cutoff)
    lowered = lower(module, (torch.randn(6, 16),), dynamic_shapes=({0: Dim("tokens", min=1, max=64)},))
    assert tensor_kernels(lowered.kernels) == [] and "GatherMm" in lowered.nodes and "ArgSort" in lowered.nodes
    for tokens in (6, 1, 9):
        x = torch.randn(tokens, 16)
        assert_close(lowered.program.forward(x), module(x))


class QuantizedExperts(torch.nn.Module):
    """The upstream delegate's SwitchLinear: each token's vector times its expert's
    quantized matrix (4 experts of 24 x 64), int8 values or 4-bit nibbles."""

    def __init__(self, bits: int):
        super().__init__()
        generator = torch.Generator().manual_seed(bits)
        self.bits = bits
        self.router = torch.nn.Linear(64, 4)
        rows, columns = 24, 64
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1)
        values = torch.randint(low, high, (4, rows, columns), generator=generator)
        if bits == 4:  # two nibbles a byte, unsigned
            unsigned = (values + 8).to(torch.uint8)
            values = unsigned[..., 0::2] | (unsigned[..., 1::2] << 4)
        self.register_buffer("w", values.to(torch.uint8 if bits == 4 else torch.int8))
        self.register_buffer("scales", torch.rand(4, rows, columns // 32, generator=generator) * 0.1)
        self.register_buffer("biases", torch.randn(4, rows, columns // 32, generator=generator) * 0.1)

    def forward(self, x):  # x: [tokens, 1, 64]
        chosen = self.router(x[:, 0]).topk(1).indices[:, 0]
        return mlx.gather_qmm(x, self.w, self.scales, self.biases, chosen, group_size=32, bits=self.bits)


@pytest.mark.parametrize("bits", [4, 8])
def test_gather_qmm_equals_its_reference(bits):
    module, x = QuantizedExperts(bits), torch.randn(6, 1, 64)
    lowered = lower(module, (x,), dynamic_shapes=({0: Dim("tokens", min=1, max=64)},))
    assert tensor_kernels(lowered.kernels) == [] and "GatherQmm" in lowered.nodes
    assert {w["format"] for d in lowered.delegates for w in d["quantized"]} == {f"int{bits}"}
    for tokens in (6, 1, 9):
        x = torch.randn(tokens, 1, 64)
        assert_close(lowered.program.forward(x), module(x))


def test_a_gather_qmm_in_another_mode_is_refused_with_the_reason(tmp_path):
    class Floating(QuantizedExperts):
        def forward(self, x):
            chosen = self.router(x[:, 0]).topk(1).indices[:, 0]
            return mlx.gather_qmm(x, self.w, self.scales, None, chosen, mode="mxfp4")

    with pytest.raises(ExportError, match=r"mlx::gather_qmm .*mode 'mxfp4'"):
        etmlx.export(Floating(4), (torch.randn(2, 1, 64),), tmp_path / "x.pte")


def test_an_mlx_op_etmlx_does_not_lower_is_refused_by_name(tmp_path):
    class Norm(torch.nn.Module):  # a custom Metal kernel of the upstream delegate
        def forward(self, x):
            return mlx.tq_norm(x)

    with pytest.raises(ExportError, match=r"mlx::tq_norm .*no lowering for this op of ExecuTorch's MLX delegate"):
        etmlx.export(Norm(), (torch.randn(2, 32),), tmp_path / "x.pte")


def test_attention_over_an_off_graph_cache_is_refused_with_what_to_write_instead(tmp_path):
    class OffGraph(torch.nn.Module):
        def forward(self, q, k, v, position):
            return torch.ops.kvcache.update_and_attend(q, k, v, position, 0, 0.35, torch.float32)

    x = torch.randn(1, 2, 3, 8)
    with pytest.raises(ExportError, match=r"kvcache::update_and_attend .*off-graph KV cache.*mlx::kv_cache_update"):
        etmlx.export(OffGraph(), (x, x, x, torch.arange(3)[:, None]), tmp_path / "x.pte")


class Sampler(torch.nn.Module):
    def forward(self, logits, temperature, top_k, top_p, seed):
        return mlx.sample(logits, temperature, top_k, top_p, seed)


@pytest.fixture(scope="module")
def sampler():
    inputs = (torch.randn(2, 16), torch.tensor(0.8), torch.tensor(5), torch.tensor(0.9), torch.tensor(0))
    lowered = lower(Sampler(), inputs, dynamic_shapes=({0: Dim("rows", min=1, max=1 << 14)}, None, None, None, None))
    assert tensor_kernels(lowered.kernels) == [] and {"RandomUniform", "Sort", "ArgMax"} <= set(lowered.nodes)
    return lowered.program


def _settings(temperature, top_k, top_p, seed):
    return torch.tensor(float(temperature)), torch.tensor(top_k), torch.tensor(float(top_p)), torch.tensor(seed)


def test_sample_is_the_argmax_where_the_temperature_is_not_positive(sampler):
    logits = torch.randn(5, 16)
    for temperature in (0.0, -1.0):  # top_k 0 would stop a sampled call; greedy reads none of it
        settings = _settings(temperature, 0, 0.5, 3)
        tokens = sampler.forward(logits, *settings)
        assert torch.equal(tokens, logits.argmax(-1)) and torch.equal(tokens, Sampler()(logits, *settings))


def test_the_same_seed_draws_the_same_tokens(sampler):
    """(Each call also runs on both runtimes, which must give the same tokens.)"""
    logits = torch.randn(64, 16)
    first, again, other = (sampler.forward(logits, *_settings(1.0, 16, 1.0, seed)) for seed in (7, 7, 2**40 + 7))
    assert torch.equal(first, again) and not torch.equal(first, other)


def _filtered_softmax(logits, temperature, top_k, top_p):
    """The probabilities sampling must draw with, in float64: softmax over the top_k
    largest, then over the fewest of those, most likely first, whose sum reaches top_p."""
    probs = (logits.double() / temperature).softmax(-1)
    order = probs.argsort(descending=True)
    probs = torch.zeros_like(probs).scatter(0, order[:top_k], probs[order[:top_k]])
    probs = probs / probs.sum()
    ordered = probs[order]
    kept = order[ordered.cumsum(0) - ordered <= top_p]
    return torch.zeros_like(probs).scatter(0, kept, probs[kept]) / probs[kept].sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 2**62, 1.0), (0.7, 5, 1.0), (1.3, 16, 0.8), (1.0, 6, 0.5)])
def test_sample_draws_from_the_filtered_softmax(sampler, temperature, top_k, top_p):
    """16384 draws (rows of one call, two seeds) against the filtered softmax: each token's
    count within 5 sigma, none outside the filter. A wrong filter, temperature or noise
    moves some count by many sigmas."""
    logits = torch.randn(16, generator=torch.Generator().manual_seed(1)) * 2
    expected = _filtered_softmax(logits, temperature, top_k, top_p)
    rows = logits.expand(8192, 16).contiguous()
    draws = torch.cat([sampler.forward(rows, *_settings(temperature, top_k, top_p, seed)) for seed in (11, 12)])
    counts = torch.bincount(draws, minlength=16).double()
    assert counts[expected == 0].sum() == 0, f"drew filtered-out tokens: {counts}"
    n = len(draws)
    sigma = (n * expected * (1 - expected)).sqrt()
    assert ((counts - n * expected).abs() <= 5 * sigma + 1).all(), f"{counts.tolist()} vs {(n * expected).tolist()}"


def test_a_sample_call_etmlx_cannot_key_is_refused_with_the_reason(tmp_path):
    class Unseeded(torch.nn.Module):
        def forward(self, logits):
            return mlx.sample(logits, torch.tensor(0.8), torch.tensor(40), torch.tensor(0.9))

    with pytest.raises(ExportError, match=r"mlx::sample .*no seed.*export with a seed"):
        etmlx.export(Unseeded(), (torch.randn(1, 32),), tmp_path / "x.pte")


def test_a_call_etmlx_cannot_compute_as_documented_is_refused_with_the_reason(tmp_path):
    class Dropping(torch.nn.Module):
        def forward(self, q, k, v):
            return mlx.custom_sdpa(q, k, v, 0, dropout_p=0.1)

    x = torch.randn(1, 2, 4, 8)
    with pytest.raises(ExportError, match=r"mlx::custom_sdpa .*dropout 0.1"):
        etmlx.export(Dropping(), (x, x, x), tmp_path / "x.pte")
