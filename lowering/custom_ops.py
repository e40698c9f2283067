"""The ``etmlx::`` custom ops that stand for a fused PyTorch call MLX will compute whole.

The partitioner retargets each *accepted* call of a fused aten op to one of these
before decomposition, so the call survives to lowering in one piece; declined calls
stay aten and decompose. Their eager kernels compute in PyTorch what MLX will (except
``random_uniform``, which asks MLX for its numbers), so a program that holds them
computes exactly what the runtimes do.
"""

import threading
from typing import Optional

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true


@torch.library.custom_op("etmlx::sdpa", mutates_args=())
def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    is_causal: bool,
    scale: float,
) -> torch.Tensor:
    """Scaled dot-product attention; k/v may have fewer heads than q (grouped-query)."""
    return _attention(q, k, v, attn_mask, is_causal, scale)


def _attention(q, k, v, attn_mask, is_causal, scale):
    # grouped-query unless the head counts are known equal (no guard on symbolic sizes;
    # enable_gqa with equal counts computes the same)
    gqa = q.dim() >= 3 and not statically_known_true(k.shape[-3] == q.shape[-3])
    return F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)


@sdpa.register_fake
def _(q, k, v, attn_mask, is_causal, scale):
    """PyTorch's own output, strides included: code after an attention may ``view`` a
    permutation of it that only PyTorch's layout makes contiguous (BEiT's heads)."""
    return _attention(q, k, v, attn_mask, is_causal, scale)


@torch.library.custom_op("etmlx::roll", mutates_args=())
def roll(x: torch.Tensor, shifts: list[int], dims: list[int]) -> torch.Tensor:
    return torch.roll(x, shifts, dims)


@roll.register_fake
def _(x, shifts, dims):
    return torch.empty_like(x)


# The group an eager all_sum sums over in this thread: None, a group of one; else an
# object whose ``sum(x)`` adds the ranks' values (``etmlx/parallel/shard_check.py`` runs ranks
# as threads of one process to check a sharding).
ALL_SUM_GROUP = threading.local()


@torch.library.custom_op("etmlx::all_sum", mutates_args=())
def all_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the ranks of a tensor-parallel program
    (``etmlx/parallel/ranks.py``): in eager PyTorch, over ``ALL_SUM_GROUP``'s group, by
    default a group of one whose sum is ``x`` itself. Lowered to MLX's ``all_sum`` over
    its process group."""
    group = getattr(ALL_SUM_GROUP, "group", None)
    return x.clone() if group is None else group.sum(x)


@all_sum.register_fake
def _(x):
    return torch.empty_like(x)


def dequantize_weight(qdata, scale, zero_point, group_size: int, bits: int) -> torch.Tensor:
    """The weight as torchao's own ``dequantize_affine`` computes it: signed ``bits``-bit
    values in int8, one scale (and zero point) per ``group_size`` values of a row."""
    import torchao  # noqa: F401  (registers torch.ops.torchao)

    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    block = [1] * (qdata.dim() - 1) + [group_size]
    return torch.ops.torchao.dequantize_affine(
        qdata, block, scale, zero_point, torch.int8, low, high, output_dtype=scale.dtype
    )


@torch.library.custom_op("etmlx::quantized_linear", mutates_args=())
def quantized_linear(
    x: torch.Tensor,
    qdata: torch.Tensor,
    scale: torch.Tensor,
    zero_point: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    group_size: int,
    bits: int,
) -> torch.Tensor:
    """``linear(x, dequantize_affine(qdata, ...), bias)`` with weights quantized to
    ``bits`` bits (``qdata`` holds them signed, in int8) per group of ``group_size``."""
    return F.linear(x, dequantize_weight(qdata, scale, zero_point, group_size, bits).to(x.dtype), bias)


@quantized_linear.register_fake
def _(x, qdata, scale, zero_point, bias, group_size, bits):
    return x.new_empty((*x.shape[:-1], qdata.shape[0]))


@torch.library.custom_op("etmlx::quantized_embedding", mutates_args=())
def quantized_embedding(
    qdata: torch.Tensor,
    scale: torch.Tensor,
    zero_point: Optional[torch.Tensor],
    indices: torch.Tensor,
    group_size: int,
    bits: int,
) -> torch.Tensor:
    """``embedding(dequantize_affine(qdata, ...), indices)``; rows quantized as above."""
    return F.embedding(indices, dequantize_weight(qdata, scale, zero_point, group_size, bits))


@quantized_embedding.register_fake
def _(qdata, scale, zero_point, indices, group_size, bits):
    return scale.new_empty((*indices.shape, qdata.shape[1]))


@torch.library.custom_op("etmlx::quantized_stack_take", mutates_args=())
def quantized_stack_take(
    qdata: torch.Tensor,
    scale: torch.Tensor,
    zero_point: Optional[torch.Tensor],
    indices: torch.Tensor,
    group_size: int,
    bits: int,
) -> torch.Tensor:
    """``dequantize_affine(qdata, ...)[indices]``: matrices of a stack (E, N, K), rows
    quantized as above, picked by index (a mixture of experts' chosen experts)."""
    return dequantize_weight(qdata, scale, zero_point, group_size, bits)[indices]


@quantized_stack_take.register_fake
def _(qdata, scale, zero_point, indices, group_size, bits):
    return scale.new_empty((*indices.shape, *qdata.shape[1:]))


def _pack_factor(bits: int) -> int:
    return 32 // bits


@torch.library.custom_op("etmlx::quantize", mutates_args=())
def quantize(x: torch.Tensor, group_size: int, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mx.quantize(x, group_size, bits)`` in MLX's affine mode along the last axis, as
    MLX's CPU kernel computes it (float32 arithmetic, round half to even): (the packed
    words as int32, the same bits as MLX's uint32; scales; biases, in ``x``'s dtype).
    ``bits`` 4 or 8: whole values a word. What a quantized KV cache writes
    (``etmlx/llm/quantized_cache.py``)."""
    groups = x.float().unflatten(-1, (-1, group_size))
    high, low = groups.amax(-1, keepdim=True), groups.amin(-1, keepdim=True)
    bins = float(2**bits - 1)
    below = low.abs() > high.abs()  # the edge the grid is anchored on: the value farther from 0
    scales = torch.clamp_min((high - low) / bins, 1e-7)
    scales = torch.where(below, scales, -scales)
    edge = torch.where(below, low, high)
    steps = torch.round(edge / scales)
    scales = torch.where(steps != 0, edge / steps, scales)
    biases = torch.where(steps != 0, edge, 0.0)
    values = torch.clamp(torch.round((groups - biases) / scales), 0, bins).to(torch.int64).flatten(-2)
    from .rules.quantized import _bitstream  # here: the rules package imports this module

    words = _bitstream(values, bits).view(torch.int32)  # MLX's packing, as export packs weights
    return words, scales.squeeze(-1).to(x.dtype), biases.squeeze(-1).to(x.dtype)


@quantize.register_fake
def _(x, group_size, bits):
    groups = (*x.shape[:-1], x.shape[-1] // group_size)
    return (x.new_empty((*x.shape[:-1], x.shape[-1] // _pack_factor(bits)), dtype=torch.int32),
            x.new_empty(groups), x.new_empty(groups))


def dequantized(words, scales, biases, group_size: int, bits: int) -> torch.Tensor:
    """What ``etmlx::quantize`` packed, as values again: ``scales * q + biases``."""
    shifts = torch.arange(_pack_factor(bits), dtype=torch.int64) * bits
    values = ((words.to(torch.int64) & 0xFFFFFFFF).unsqueeze(-1) >> shifts) & (2**bits - 1)
    groups = values.flatten(-2).unflatten(-1, (-1, group_size)).to(scales.dtype)
    return (groups * scales.unsqueeze(-1) + biases.unsqueeze(-1)).flatten(-2)


@torch.library.custom_op("etmlx::quantized_matmul", mutates_args=())
def quantized_matmul(
    x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, transpose: bool,
    group_size: int, bits: int,
) -> torch.Tensor:
    """``x @ w^T`` (``transpose``) or ``x @ w``, ``w`` packed by ``etmlx::quantize``, batch
    dims broadcast (``mx.quantized_matmul``): attention over a quantized KV cache. As
    MLX's kernel, it dequantizes and accumulates in float32, whatever ``x``'s dtype."""
    w = dequantized(words, scales.float(), biases.float(), group_size, bits)  # MLX's kernel: in float32
    return torch.matmul(x.float(), w.transpose(-1, -2) if transpose else w).to(x.dtype)


@quantized_matmul.register_fake
def _(x, words, scales, biases, transpose, group_size, bits):
    columns = words.shape[-2] if transpose else words.shape[-1] * _pack_factor(bits)
    batch = torch.broadcast_shapes(x.shape[:-2], words.shape[:-2])
    return x.new_empty((*batch, x.shape[-2], columns))


@torch.library.custom_op("etmlx::random_uniform", mutates_args=())
def random_uniform(seed: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """float32 numbers in [0, 1) drawn by MLX's generator keyed by ``seed`` (a 0-d integer
    tensor): ``mx.random.uniform(shape=shape, key=mx.random.key(seed))``, the same numbers
    on every runtime and in this eager kernel, which asks MLX for them. The noise of
    ``mlx::sample`` (ExecuTorch's MLX delegate's on-device sampler)."""
    import mlx.core as mx  # only an eager run of the exported program draws here
    import numpy as np

    key = mx.random.key(int(seed) % 2**64)
    return torch.from_numpy(np.array(mx.random.uniform(shape=list(shape), key=key)))


@random_uniform.register_fake
def _(seed, shape):
    return seed.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op("etmlx::gated_delta", mutates_args=())
def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
                state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule (``mx.fast.gated_delta_update``), one step at a time from
    ``state``: per step, the state decays by ``gamma``, moves towards ``v`` along ``k`` by
    ``beta``, and is read by ``q``. q, k (B, T, Hk, Dk); v (B, T, Hv, Dv), value head h
    reading key head h // (Hv / Hk); gamma, beta (B, T, Hv); state (B, Hv, Dv, Dk).
    Returns the output (B, T, Hv, Dv) and the state after the last step."""
    repeat = v.shape[2] // q.shape[2]
    q, k = (x.repeat_interleave(repeat, dim=2) for x in (q, k))
    steps = []
    for t in range(q.shape[1]):
        state = state * gamma[:, t, :, None, None]
        remembered = (state * k[:, t, :, None, :]).sum(-1)
        state = state + ((v[:, t] - remembered) * beta[:, t, :, None])[..., None] * k[:, t, :, None, :]
        steps.append((state * q[:, t, :, None, :]).sum(-1))
    return torch.stack(steps, dim=1), state


@gated_delta.register_fake
def _(q, k, v, gamma, beta, state):
    return v.new_empty(v.shape), state.new_empty(state.shape)


@torch.library.custom_op("etmlx::selective_scan", mutates_args=())
def selective_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba's selective state-space scan, one step at a time from ``state``: per step
    each channel's state decays by ``exp(dt * a)``, takes in ``dt * x`` along ``b``, and
    is read along ``c``. x, dt (B, T, D); a (D, N); b, c (B, T, N); state (B, D, N).
    Returns the output (B, T, D) and the state after the last step."""
    steps = []
    for t in range(x.shape[1]):
        decay = torch.exp(dt[:, t, :, None] * a)
        state = decay * state + (dt[:, t] * x[:, t])[..., None] * b[:, t, None, :]
        steps.append((state * c[:, t, None, :]).sum(-1))
    return torch.stack(steps, dim=1), state


@selective_scan.register_fake
def _(x, dt, a, b, c, state):
    return x.new_empty(x.shape), state.new_empty(state.shape)
