"""Scaled dot-product attention: a differential matrix against eager PyTorch.

Every case asserts what was serialized (fused: an Sdpa node with the rank adapters;
declined: no Sdpa node, the decomposition delegated to MLX) and parity with eager.
The expected verdict is written out here from the rules in the issue, independently
of the code under test.
"""

import pytest
import torch
import torch.nn.functional as F

import etmlx
import mlx.core as mx
import numpy as np
from etmlx.runtime_shim.mlx_ops import cpu_math

from lowering_harness import Fn, check_parity
from ruletest import untested_rules


def repeat_kv(x, n):
    """Hugging Face's repeat_kv: unsqueeze -> expand -> reshape."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


class Attention(torch.nn.Module):
    def __init__(self, is_causal=False, scale=None, enable_gqa=False, repeat=None):
        super().__init__()
        self.is_causal, self.scale, self.enable_gqa, self.repeat = is_causal, scale, enable_gqa, repeat

    def forward(self, q, k, v, mask=None):
        if self.repeat == "repeat_interleave":
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        elif self.repeat == "repeat_kv":
            k, v = repeat_kv(k, 2), repeat_kv(v, 2)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.is_causal, scale=self.scale, enable_gqa=self.enable_gqa
        )


LEAD = {2: (), 3: (4,), 4: (2, 4), 5: (2, 2, 4)}  # leading dims by rank (last lead dim: heads)


def shapes(rank, lq=6, lk=6, e=8, batch=None, kv_heads=None):
    lead = list(LEAD[rank])
    q = (*lead, lq, e)
    kv_lead = list(lead)
    if kv_heads is not None:
        kv_lead[-1] = kv_heads
    if batch is not None:
        kv_lead[0] = batch
    k = (*kv_lead, lk, e)
    return q, k


def make(shape, dtype):
    return torch.randn(*shape).to(dtype)


def bool_mask(lq, lk, lead=(), fully_masked_row=None):
    mask = torch.rand(*lead, lq, lk) > 0.4
    mask[..., 0] = True  # every row attends somewhere, unless a row is cleared below
    if fully_masked_row is not None:
        mask[..., fully_masked_row, :] = False
    return mask


def float_mask(lq, lk, dtype, lead=(), fully_masked_row=None):
    mask = torch.randn(*lead, lq, lk).to(dtype)
    mask[torch.rand(*lead, lq, lk) > 0.7] = float("-inf")
    mask[..., 0] = 0.0
    if fully_masked_row is not None:
        mask[..., fully_masked_row, :] = float("-inf")
    return mask


CASES = [
    # name, module kwargs, shape kwargs, mask kind, fused (for ranks 2-4)
    ("plain", {}, {}, None, True),
    ("causal_equal", {"is_causal": True}, {}, None, True),
    ("causal_lq_lt_lk", {"is_causal": True}, {"lq": 3, "lk": 7}, None, False),
    ("causal_lq_gt_lk", {"is_causal": True}, {"lq": 7, "lk": 3}, None, False),
    ("bool_mask", {}, {"lq": 5, "lk": 7}, "bool", True),
    ("float_mask", {}, {"lq": 5, "lk": 7}, "float", True),
    ("broadcast_mask", {}, {"lq": 5, "lk": 7}, "broadcast", True),
    ("fully_masked_row_bool", {}, {}, "bool_full_row", True),
    ("fully_masked_row_float", {}, {}, "float_full_row", True),
    ("explicit_scale", {"scale": 0.3}, {}, None, True),
    ("batch_1", {}, {}, None, True),
]


def _mask(kind, q_shape, k_shape, dtype):
    lq, lk = q_shape[-2], k_shape[-2]
    lead = q_shape[:-2]
    if kind == "bool":
        return bool_mask(lq, lk, lead)
    if kind == "float":
        return float_mask(lq, lk, dtype, lead)
    if kind == "broadcast":  # a key-padding mask: (batch, 1, ..., 1, lk)
        return bool_mask(1, lk, lead[:1] + (1,) * (len(lead) - 1))
    if kind == "bool_full_row":
        return bool_mask(lq, lk, lead, fully_masked_row=2)
    if kind == "float_full_row":
        return float_mask(lq, lk, dtype, lead, fully_masked_row=2)
    return None


def assert_fused(lowered, rank, mask):
    assert lowered.nodes.count("Sdpa") == 1
    adapted = rank < 4  # one ExpandDims per operand (q, k, v, a same-rank mask), one Squeeze
    expanded = 3 + (mask is not None and mask.dim() == rank)
    assert lowered.nodes.count("ExpandDims") == (expanded if adapted else 0)
    assert lowered.nodes.count("Squeeze") == (1 if adapted else 0)
    assert lowered.kernels == []


def assert_declined(lowered):
    assert "Sdpa" not in lowered.nodes
    assert "Matmul" in lowered.nodes and "Softmax" in lowered.nodes  # the decomposition, on MLX
    assert lowered.kernels == []
    (entry,) = [e for op, e in lowered.report.operators.items() if "scaled_dot_product" in op]
    assert entry.decomposed


@pytest.mark.parametrize("rank", [2, 3, 4, 5])
@pytest.mark.parametrize("name, module_kwargs, shape_kwargs, mask_kind, fused", CASES, ids=[c[0] for c in CASES])
def test_matrix_fp32(rank, name, module_kwargs, shape_kwargs, mask_kind, fused):
    _run_case(rank, module_kwargs, shape_kwargs, mask_kind, fused and rank <= 4, torch.float32, name)


HALF_CASES = [c for c in CASES if c[0] in ("plain", "causal_equal", "causal_lq_lt_lk", "float_mask", "bool_full_row")]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("name, module_kwargs, shape_kwargs, mask_kind, fused", HALF_CASES, ids=[c[0] for c in HALF_CASES])
def test_matrix_half(rank, dtype, name, module_kwargs, shape_kwargs, mask_kind, fused):
    _run_case(rank, module_kwargs, shape_kwargs, mask_kind, fused, dtype, name)


def _run_case(rank, module_kwargs, shape_kwargs, mask_kind, fused, dtype, name):
    torch.manual_seed(rank)
    if name == "batch_1" and rank >= 4:
        shape_kwargs = {}
        q_shape, k_shape = shapes(rank)
        q_shape, k_shape = (1, *q_shape[1:]), (1, *k_shape[1:])
    else:
        q_shape, k_shape = shapes(rank, **shape_kwargs)
    v_shape = (*k_shape[:-1], 5)  # a value head dim unlike the query's
    q, k, v = make(q_shape, dtype), make(k_shape, dtype), make(v_shape, dtype)
    mask = _mask(mask_kind, q_shape, k_shape, dtype)
    inputs = (q, k, v) if mask is None else (q, k, v, mask)
    lowered = check_parity(Attention(**module_kwargs), inputs)
    if fused:
        assert_fused(lowered, rank, mask)
    else:
        assert_declined(lowered)


@pytest.mark.parametrize("rank", [3, 4])
def test_unequal_batch_or_broadcast_heads(rank):
    """Rank 4: k/v batch 1 against q batch 2 is declined. Rank 3: dim 0 is heads, and a
    single k/v head broadcast is what MLX's multi-query attention computes."""
    q_shape, k_shape = shapes(rank, batch=1)
    lowered = check_parity(Attention(), (make(q_shape, torch.float32), make(k_shape, torch.float32), make(k_shape, torch.float32)))
    if rank == 4:
        assert_declined(lowered)
    else:
        assert_fused(lowered, rank, None)


@pytest.mark.parametrize("rank", [3, 4])
def test_enable_gqa(rank):
    q_shape, k_shape = shapes(rank, kv_heads=2)
    inputs = tuple(make(s, torch.float32) for s in (q_shape, k_shape, k_shape))
    assert_fused(check_parity(Attention(enable_gqa=True), inputs), rank, None)


@pytest.mark.parametrize("mask_kind", ["bool", "causal"])
def test_both_runtimes_compute_attention_alike_on_mlx_cpu(mask_kind):
    """On MLX's CPU both runtimes compute Sdpa as MLX's own decomposition with etmlx's
    softmax (cpu_math): grouped heads and a mask, equal to eager, and to cpu_math's
    attention to the bit (MLX's own softmax rounds otherwise)."""
    q_shape, k_shape = shapes(4, kv_heads=2)
    inputs = [make(s, torch.float32) for s in (q_shape, k_shape, k_shape)]
    if mask_kind == "bool":
        inputs.append(bool_mask(q_shape[-2], k_shape[-2], lead=(q_shape[0], 1)))
    lowered = check_parity(Attention(is_causal=mask_kind == "causal", enable_gqa=True), tuple(inputs))
    assert_fused(lowered, 4, inputs[3] if mask_kind == "bool" else None)
    outputs = [etmlx.load(lowered.pte, runtime=runtime).forward(*inputs) for runtime in etmlx.RUNTIMES]
    q, k, v, *mask = (mx.array(x.numpy()) for x in inputs)
    etmlx_form = cpu_math.attention(q, k, v, q.shape[-1] ** -0.5, mask[0] if mask else "causal")
    assert all(torch.equal(output, torch.from_numpy(np.array(etmlx_form))) for output in outputs)


def test_gqa_heads_not_dividing_is_declined():
    q_shape, k_shape = shapes(4, kv_heads=3)
    q_shape = (2, 4, 6, 8)
    inputs = tuple(make(s, torch.float32) for s in (q_shape, k_shape, k_shape))
    with pytest.raises(Exception):  # PyTorch itself rejects it in eager; export must not hide that
        Attention(enable_gqa=True)(*inputs)


@pytest.mark.parametrize("repeat", ["repeat_interleave", "repeat_kv"])
def test_rank4_repeat_is_absorbed(repeat):
    q_shape, k_shape = shapes(4, kv_heads=2)
    inputs = tuple(make(s, torch.float32) for s in (q_shape, k_shape, k_shape))
    lowered = check_parity(Attention(repeat=repeat), inputs)
    assert lowered.nodes == ["Sdpa"]  # k/v reach the kernel un-repeated: no repeat nodes at all


def test_rank3_repeat_is_kept():
    class Rank3Repeat(torch.nn.Module):
        def forward(self, q, k, v):
            # dim 1 is the sequence at rank 3: repeating it duplicates real keys
            return F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))

    inputs = (torch.randn(4, 6, 8), torch.randn(4, 3, 8), torch.randn(4, 3, 8))
    lowered = check_parity(Rank3Repeat(), inputs)
    assert "Sdpa" in lowered.nodes and len(lowered.nodes) > 5  # the repeat stays in the graph


def test_claimed_and_declined_calls_in_one_graph():
    class Both(torch.nn.Module):
        def forward(self, q, k, v, q_short):
            fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            declined = F.scaled_dot_product_attention(q_short, k, v, is_causal=True)  # Lq < Lk
            return fused.sum() + declined.sum(), fused

    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    lowered = check_parity(Both(), (q, k, v, torch.randn(2, 4, 3, 8)))
    assert lowered.nodes.count("Sdpa") == 1 and lowered.kernels == []
    entry = lowered.report.operators["aten::scaled_dot_product_attention"]
    assert len(entry.decomposed) == 1 and "query length" in entry.decomposed[0][1]


class AttentionBlock(torch.nn.Module):
    """The shape that breaks ExecuTorch's per-node filter path: SDPA output transposed
    and reshaped (a view of a non-contiguous tensor)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def test_attention_block_with_transposed_output():
    lowered = check_parity(AttentionBlock(), (torch.randn(2, 5, 32),))
    assert "Sdpa" in lowered.nodes and len(lowered.delegates) == 1 and lowered.kernels == []


def test_a_view_that_relies_on_pytorchs_output_layout():
    """BEiT views the heads' permuted output without a copy: contiguous only in the
    layout PyTorch's attention writes, which etmlx's op must report when retraced."""
    def fn(x, bias):
        q, k, v = x.view(1, 17, 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).permute(0, 2, 1, 3).contiguous()
        return y.view(*y.shape[:-2], 32)

    lowered = check_parity(Fn(fn), (torch.randn(1, 17, 96), torch.randn(1, 4, 17, 17)))
    assert "Sdpa" in lowered.nodes and lowered.kernels == []


def test_attention_block_dynamic_sequence():
    seq = torch.export.Dim("seq", min=2, max=64)
    lowered = check_parity(
        AttentionBlock(), (torch.randn(2, 5, 32),), dynamic_shapes=({1: seq},),
        run_with=[(torch.randn(2, 9, 32),), (torch.randn(2, 64, 32),)],
    )
    assert "Sdpa" in lowered.nodes and lowered.kernels == []


def test_two_rolls_one_taken_one_declined():
    class TwoRolls(torch.nn.Module):
        def forward(self, x):
            taken = torch.roll(x, shifts=(1, -2), dims=(0, 1))
            declined = torch.roll(x.double(), shifts=3, dims=1)  # float64: MLX does not compute it
            return taken, declined

    lowered = check_parity(TwoRolls(), (torch.randn(4, 6),))
    assert lowered.nodes.count("Roll") == 1
    entry = lowered.report.operators["aten::roll"]
    assert len(entry.decomposed) == 1 and "float64" in entry.decomposed[0][1]


def test_expand_reshape_that_is_not_a_head_repeat_is_kept():
    class SequenceRepeat(torch.nn.Module):
        def forward(self, q, k, v):
            b, h, s, d = k.shape
            # unsqueeze(2) -> expand -> reshape, but onto the sequence: every key twice
            k2 = k[:, :, None].expand(b, h, 2, s, d).reshape(b, h, 2 * s, d)
            v2 = v[:, :, None].expand(b, h, 2, s, d).reshape(b, h, 2 * s, d)
            return F.scaled_dot_product_attention(q, k2, v2)

    inputs = (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8))
    lowered = check_parity(SequenceRepeat(), inputs)
    assert "Sdpa" in lowered.nodes and "BroadcastTo" in lowered.nodes  # the repeat stays


def test_dropout_is_declined_per_call():
    class Dropout(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.25), F.scaled_dot_product_attention(q, k, v)

    inputs = tuple(torch.randn(2, 4, 6, 8) for _ in range(3))
    from lowering_harness import lower

    lowered = lower(Dropout(), inputs)
    entry = lowered.report.operators["aten::scaled_dot_product_attention"]
    assert [reason for _, reason in entry.decomposed] == ["dropout_p=0.25"]
    assert lowered.nodes.count("Sdpa") == 1  # the call without dropout keeps the kernel
    for program in lowered.program.programs.values():  # each alone: dropout draws differ
        random_out, exact_out = program.forward(*inputs)
        assert random_out.shape == (2, 4, 6, 8)
        torch.testing.assert_close(exact_out, F.scaled_dot_product_attention(*inputs), rtol=1e-5, atol=1e-5)


def test_float64_attention_is_declined_but_correct():
    inputs = tuple(torch.randn(2, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    lowered = check_parity(Attention(is_causal=True), inputs)
    assert "Sdpa" not in lowered.nodes and lowered.kernels  # decomposed, then left to the CPU
    (entry,) = [e for op, e in lowered.report.operators.items() if "scaled_dot_product" in op]
    assert "float64" in entry.decomposed[0][1]


def test_every_attention_rule_is_tested(whole_file):
    assert untested_rules("attention") == set()
