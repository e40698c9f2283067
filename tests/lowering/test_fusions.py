"""The fusions of ``lowering/fusions``: each fuses what it names, with parity, and leaves
look-alikes alone. (The fused calls, attention and roll, are tested with their rules
in test_attention.py and test_custom_ops.py.)"""

import pytest
import torch
from fuzz.corpus import Experts
from ruletest import delegated

from etmlx.lowering.fusions import LOWERING_FUSIONS
from etmlx.serializer import node_type


def test_every_lowering_fusion_is_listed_here():
    assert [fusion.NAME for fusion in LOWERING_FUSIONS] == [
        "RMS norm -> mx.fast.rms_norm", "rotary embedding -> mx.fast.rope",
        "batched matmul of gathered matrices -> mx.gather_mm",
        "linear / embedding of ExecuTorch's exportable quantized tensors -> mx.quantized_matmul / packed rows",  # test_quantized.py
    ]


class LlamaStyleRmsNorm(torch.nn.Module):
    """As transformers writes it: to float32, x * rsqrt(mean(x^2) + eps), back, times weight."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.rand(dim) + 0.5), eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_rms_norm_fuses(dtype):
    for module in (LlamaStyleRmsNorm(16).to(dtype), torch.nn.RMSNorm(16, eps=1e-5).to(dtype)):
        lowered = delegated(module, (torch.randn(2, 3, 16).to(dtype) * 3,), nodes=["RmsNorm"])
        assert "Power" not in lowered.nodes and "Rsqrt" not in lowered.nodes  # replaced, then removed


def test_rms_norm_look_alikes_do_not_fuse():
    def over_first_axis(x):
        return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)

    def cubed(x):
        return x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + 1e-6)

    def other_tensor(x, y):
        return y * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    for fn, inputs in ((over_first_axis, (torch.randn(4, 8),)), (cubed, (torch.rand(4, 8) + 1,)),
                       (other_tensor, (torch.randn(4, 8), torch.randn(4, 8)))):
        lowered = delegated(fn, inputs, nodes=["Rsqrt"])
        assert "RmsNorm" not in lowered.nodes


# ---------------------------------------------------------------- rotary embeddings
HEAD_DIM = 16
INV_FREQ = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float) / HEAD_DIM))


def _llama_config(**rope):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=4 * HEAD_DIM, num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM,
        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, **rope},
    )


class LlamaRotation(torch.nn.Module):
    """q and k rotated by transformers' own Llama code at positions ``start + arange(T)``."""

    def __init__(self, config):
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        super().__init__()
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, q, k, start):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cos, sin = self.rotary(q, (torch.arange(q.shape[-2]) + start).unsqueeze(0))
        return apply_rotary_pos_emb(q, k, cos, sin)


def _q_k_start(tokens, dtype=torch.float32, start=7):
    return torch.randn(1, 4, tokens, HEAD_DIM).to(dtype), torch.randn(1, 2, tokens, HEAD_DIM).to(dtype), torch.tensor([start])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_rotary_embedding_fuses(dtype):
    """Prefill-like (T dynamic) and far positions: one Rope each for q and k, no sine left."""
    tokens = torch.export.Dim("tokens", min=1, max=32)
    lowered = delegated(
        LlamaRotation(_llama_config()).to(dtype), _q_k_start(5, dtype),
        dynamic_shapes=({2: tokens}, {2: tokens}, None),
        run_with=[_q_k_start(1, dtype, start=4095), _q_k_start(3, dtype, start=30000)],
    )
    assert lowered.nodes.count("Rope") == 2
    assert not {"Cos", "Sin", "Concatenate", "Negative"} & set(lowered.nodes)
    # q and k read the same offset and frequency slots, so the runtimes share their angles
    ropes = [node.op for node in _delegate_graph(lowered.pte).nodes if node_type(node) == "Rope"]
    assert len({(op.offset.idx, op.freqs.idx) for op in ropes}) == 1


def _delegate_graph(pte: bytes):
    from etmlx.runtime_shim.pte_file import read_pte
    from etmlx.serializer import deserialize

    program = read_pte(pte)
    (plan,) = program.program.plans
    return deserialize(program.delegate_data(plan.delegates[0]))


def test_rope_frequencies_are_given_back_bit_for_bit():
    """MLX computes 1 / freqs: the freqs chosen give back inv_freq exactly, and a value
    no float32 reciprocal gives back (just under 1, where spacing halves) fuses nothing."""
    from etmlx.lowering.fusions.rope import _reciprocals_that_round_trip

    freqs = _reciprocals_that_round_trip(INV_FREQ)
    assert torch.equal(1 / freqs, INV_FREQ)
    assert _reciprocals_that_round_trip(torch.tensor([1 - 3 * 2.0**-24])) is None


def _positions(q, start):
    return torch.arange(q.shape[-2])[None] + start  # LlamaRotation adds, then unsqueezes


def _cos_sin(positions, inv_freq=INV_FREQ, scaling=1.0, angle_dtype=torch.float32, unsqueeze_dim=1):
    freqs = positions[..., None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1).to(angle_dtype)
    return (angles.cos() * scaling).unsqueeze(unsqueeze_dim), (angles.sin() * scaling).unsqueeze(unsqueeze_dim)


def _rotate_half(x, half=HEAD_DIM // 2):
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotated(q, cos, sin, turn=_rotate_half):
    return q * cos + turn(q) * sin


def _not_rotary(q, start):
    """Each a piece away from the pattern (the first is the pattern, as a control)."""
    positions = _positions(q, start)
    cos, sin = _cos_sin(positions)
    return {
        "control": _rotated(q, cos, sin),
        "rotated back": q * cos - _rotate_half(q) * sin,
        "halves not swapped": _rotated(q, cos, sin, turn=lambda x: torch.cat((x[..., :8], -x[..., 8:]), -1)),
        "quarter turn": _rotated(q, cos, sin, turn=lambda x: _rotate_half(x, half=4)),
        "sine one position on": _rotated(q, cos, _cos_sin(positions + 1)[1]),
        "scaled": _rotated(q, *_cos_sin(positions, scaling=0.5)),
        "angles in bf16": _rotated(q, *_cos_sin(positions, angle_dtype=torch.bfloat16)),
        "every other position": _rotated(q, *_cos_sin(torch.arange(0, 2 * q.shape[-2], 2)[None] + start)),
        "counted from one": _rotated(q, *_cos_sin(torch.arange(1, q.shape[-2] + 1)[None] + start)),
        "frequency without a reciprocal": _rotated(q, *_cos_sin(positions, inv_freq=INV_FREQ * (1 - 3 * 2.0**-24))),
    }


def test_rotary_look_alikes_do_not_fuse():
    """All in one program, with T dynamic, so that no position is folded into a constant
    at export: the control alone becomes a Rope."""
    q, start = torch.randn(1, 4, 5, HEAD_DIM), torch.tensor([3])
    tokens = ({2: torch.export.Dim("tokens", min=2, max=16)}, None)
    lowered = delegated(lambda q, start: tuple(_not_rotary(q, start).values()), (q, start), dynamic_shapes=tokens)
    assert lowered.nodes.count("Rope") == 1


def test_rotary_positions_from_an_input_or_along_another_axis_do_not_fuse():
    """Positions the caller passes need not count up; cos/sin along axis 1 of (B, T, H, D)
    rotate by token, where MLX would rotate axis -2 (the heads)."""
    q = torch.randn(1, 4, 5, HEAD_DIM)
    given = delegated(lambda q, positions: _rotated(q, *_cos_sin(positions)), (q, torch.tensor([[0, 1, 5, 2, 9]])))
    assert "Rope" not in given.nodes

    def by_token(q, start):  # q is (B, T, H, D), as transformers' unsqueeze_dim=2 expects
        return _rotated(q, *_cos_sin(torch.arange(q.shape[1])[None] + start, unsqueeze_dim=2))

    for tokens in (5, 1):  # one token: cos/sin are (1, 1, 1, D), and only the count tells
        lowered = delegated(by_token, (torch.randn(1, tokens, 4, HEAD_DIM), torch.tensor([2])))
        assert "Rope" not in lowered.nodes


def test_partial_rotary_fuses_over_the_rotated_part():
    """Rotary over the first half of each head (Phi-style): the Rope rotates that slice."""
    def partial(q, start):
        rotated = _rotated(q[..., :HEAD_DIM], *_cos_sin(_positions(q, start)))
        return torch.cat((rotated, q[..., HEAD_DIM:]), dim=-1)

    lowered = delegated(partial, (torch.randn(1, 4, 5, 2 * HEAD_DIM), torch.tensor([11])))
    assert lowered.nodes.count("Rope") == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gathered_expert_matmuls_fuse(dtype):
    """A mixture of experts (``fuzz.corpus.Experts``) over any number of tokens: the
    gathers of weights are gone, one GatherMm per bmm."""
    from torch.export import Dim

    torch.manual_seed(0)
    module = Experts().to(dtype)
    tokens = Dim("tokens", min=1, max=64)
    lowered = delegated(
        module, (torch.randn(5, 16).to(dtype),), dynamic_shapes=({0: tokens},),
        run_with=[(torch.randn(33, 16).to(dtype),), (torch.randn(1, 16).to(dtype),)],
    )
    assert lowered.nodes.count("GatherMm") == 2 and "Index" not in lowered.nodes and "CheckIndex" not in lowered.nodes
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    stored = sum(lowered.inspect["named_data"].values())
    assert weights <= stored < 1.1 * weights  # each stack once (one of them transposed), not also as gathered


def test_gathered_matmul_look_alikes_do_not_fuse():
    """Expert ids from an input (not provably in range: gathered and checked), and a
    gather along another dim: each stays a gather and a matmul."""
    weights = torch.randn(4, 6, 5)

    def fn(ids, x):
        return torch.bmm(weights[ids], x), torch.bmm(weights[:, ids[:2]].transpose(0, 1), x[:2])

    lowered = delegated(fn, (torch.tensor([3, 0, 3]), torch.randn(3, 5, 2)), nodes=["CheckIndex", "Index", "Matmul"])
    assert "GatherMm" not in lowered.nodes


@pytest.mark.parametrize("scheme", ["int4", "int5", "int8"])
def test_gathered_quantized_expert_matmuls_fuse(scheme):
    """The same experts with their stacks quantized (``quantized_copy``): one GatherQmm per
    bmm, in both orientations, nothing dequantized."""
    from etmlx.quant.weights import quantized_copy

    torch.manual_seed(0)
    module, names = quantized_copy(Experts(dim=32), scheme, 32)
    assert {"up_proj", "down_proj"} <= set(names)  # (and the router, a Linear)
    lowered = delegated(module, (torch.randn(5, 32),))
    assert lowered.nodes.count("GatherQmm") == 2 and "Dequantize" not in lowered.nodes and "GatherMm" not in lowered.nodes
    bits = int(scheme[3:])
    stacks = [c for d in lowered.delegates for c in d["constants"] if c["dtype"] == "uint32" and len(c["shape"]) == 3]
    assert stacks and all(c["shape"][-1] == bits for c in stacks)  # rows of 32 values, packed at their width
