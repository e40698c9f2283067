"""The ``etmlx::`` custom ops that stand for a fused PyTorch call MLX will compute whole.

The partitioner retargets each *accepted* call of a fused aten op to one of these
before decomposition, so the call survives to lowering in one piece; declined calls
stay aten and decompose. Their eager kernels call PyTorch itself, so a program that
holds them computes exactly what the original did.
"""

from typing import Optional

import torch
import torch.nn.functional as F


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
    gqa = q.dim() >= 3 and k.shape[-3] != q.shape[-3]
    return F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)


@sdpa.register_fake
def _(q, k, v, attn_mask, is_causal, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.custom_op("etmlx::roll", mutates_args=())
def roll(x: torch.Tensor, shifts: list[int], dims: list[int]) -> torch.Tensor:
    return torch.roll(x, shifts, dims)


@roll.register_fake
def _(x, shifts, dims):
    return torch.empty_like(x)
