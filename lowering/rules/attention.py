"""Scaled dot-product attention on ``mx.fast.scaled_dot_product_attention``, and roll.

``check_sdpa`` decides, from example values alone, whether MLX's fused kernel
computes exactly what PyTorch does for one call. The partitioner asks it before
decomposition (to retarget the call to ``etmlx::sdpa``) and lowering asks it again
for the custom op: one decision, two places.

Known differences the checks guard against:
- the kernel takes rank 4 only: rank 2 and 3 get leading dims added (front: at rank 3
  dim 0 is already the head dim) and squeezed away after;
- MLX's causal mask is anchored bottom-right, PyTorch's top-left: equal only when the
  query and key lengths are equal;
- a fully masked row is 0 in PyTorch (safe softmax) but NaN or an average in MLX:
  lowering zeroes such rows after the kernel unless a constant mask has none.
"""

import math
from typing import Optional

import torch

from etmlx.serializer.generated.etmlx_ir import Binary, ExpandDims, Reduce, Roll, Scalar, Sdpa, Squeeze, Where
from etmlx.serializer.generated.etmlx_ir.BinaryOp import BinaryOp
from etmlx.serializer.generated.etmlx_ir.ReduceOp import ReduceOp

from ..dtypes import FLOATING, fill_fields
from ..registry import lowers
from .common import normalize_axis, rank_of, same_size


def check_sdpa(q, k, v, mask, dropout_p=0.0, is_causal=False, enable_gqa=False) -> Optional[str]:
    """None when the fused kernel computes this call exactly; otherwise why not."""
    rank = q.dim()
    if not 2 <= rank <= 4:
        return f"rank {rank} attention (the MLX kernel takes rank 4; etmlx adapts ranks 2 and 3)"
    if k.dim() != rank or v.dim() != rank:
        return "q, k and v of different ranks"
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}"
    if q.dtype not in FLOATING or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}/{k.dtype}/{v.dtype} (the kernel takes float32, float16, bfloat16 alike)"
    if mask is not None and mask.dtype not in (torch.bool, q.dtype):
        return f"a {mask.dtype} mask with {q.dtype} inputs"
    if mask is not None and mask.dim() > 4:
        return "a mask of rank above 4"
    if rank == 4 and not (same_size(q.shape[0], k.shape[0]) and same_size(q.shape[0], v.shape[0])):
        return "unequal batch sizes among q, k, v"
    if not same_size(k.shape[-2], v.shape[-2]) or not same_size(q.shape[-1], k.shape[-1]):
        return "k/v lengths or q/k head dims differ"
    if rank >= 3:
        reason = _check_heads(q.shape[-3], k.shape[-3], v.shape[-3], enable_gqa)
        if reason:
            return reason
    if is_causal and not same_size(q.shape[-2], k.shape[-2]):
        return "is_causal with query length != key length (MLX anchors the causal mask bottom-right)"
    if is_causal and mask is not None:
        return "is_causal together with a mask"
    if any(same_size(size, 0) for size in (q.shape[-2], k.shape[-2], q.shape[-1])):
        return "an empty query, key or head dim"
    if not isinstance(q.shape[-1], int):
        return "a dynamic head dim (the default scale depends on it)"
    return None


def _check_heads(q_heads, k_heads, v_heads, enable_gqa) -> Optional[str]:
    if not same_size(k_heads, v_heads):
        return "k and v with different head counts"
    if same_size(k_heads, q_heads) or same_size(k_heads, 1):
        return None  # equal heads, or one k/v head broadcast (what MLX's MQA computes)
    if not (isinstance(q_heads, int) and isinstance(k_heads, int)):
        return "dynamic head counts"
    if k_heads == 0 or q_heads % k_heads:
        return f"{k_heads} key/value heads for {q_heads} query heads"
    if not enable_gqa:
        return "different head counts without enable_gqa"
    return None


def _check_sdpa(node, args):
    """The same decision for the custom op; fewer k/v heads here can only come from an
    accepted GQA call (enable_gqa, or an absorbed repeat), hence enable_gqa=True."""
    mask = None if args.attn_mask is None else args.attn_mask.meta["val"]
    q, k, v = (arg.meta["val"] for arg in (args.q, args.k, args.v))
    return check_sdpa(q, k, v, mask, is_causal=args.is_causal, enable_gqa=True)


@lowers("etmlx::sdpa", check=_check_sdpa)
def _lower_sdpa(ctx, node, args):
    q, k, v, mask, is_causal, scale = args.q, args.k, args.v, args.attn_mask, args.is_causal, args.scale
    missing = 4 - rank_of(q)
    lead = list(range(missing))

    def to_rank4(arg):
        """Leading dims at the front; a lower-rank mask already broadcasts as it is."""
        slot = ctx.tensor(arg)
        return ctx.emit(ExpandDims, x=slot, axes=lead) if missing and rank_of(arg) == rank_of(q) else slot

    fields = dict(q=to_rank4(q), k=to_rank4(k), v=to_rank4(v), causal=bool(is_causal), scale=float(scale))
    if mask is not None:
        fields.update(mask=to_rank4(mask), hasMask=True)
    out = ctx.emit(Sdpa, **fields)
    if mask is not None and _may_mask_whole_rows(ctx, mask):
        out = _zero_fully_masked_rows(ctx, out, fields["mask"], mask.meta["val"].dtype, q.meta["val"].dtype)
    if missing:
        out = ctx.emit(Squeeze, x=out, axes=lead)
    ctx.bind(node, out)


def _may_mask_whole_rows(ctx, mask) -> bool:
    """False only for a constant mask (a registered causal mask, say) that leaves every
    query some key: then the fix-up below is dropped at export."""
    if not ctx.is_constant(mask):
        return True
    value = ctx.constant_values[mask]
    attended = value if value.dtype == torch.bool else value != -math.inf
    return not bool(attended.any(dim=-1).all())


def _zero_fully_masked_rows(ctx, out, mask_slot, mask_dtype, out_dtype):
    """PyTorch returns 0 for a query that may attend to no key; MLX returns NaN (additive
    mask) or an average (boolean mask). Costs one pass over the mask."""
    attended = mask_slot
    if mask_dtype != torch.bool:
        minus_inf = ctx.emit(Scalar, **fill_fields(-math.inf, mask_dtype))
        attended = ctx.emit(Binary, op=BinaryOp.NotEqual, a=mask_slot, b=minus_inf)
    any_key = ctx.emit(Reduce, op=ReduceOp.Any, x=attended, axes=[-1], keepdims=True)
    zero = ctx.emit(Scalar, **fill_fields(0.0, out_dtype))
    return ctx.emit(Where, cond=any_key, a=out, b=zero)


def check_roll(x, shifts, dims) -> Optional[str]:
    if not dims or len(shifts) != len(dims):
        return "roll over the flattened tensor, or with shifts and dims of different lengths"
    if not all(isinstance(v, int) for v in (*shifts, *dims)):
        return "roll by a dynamic shift"
    return None


def _check_roll(node, args):
    return check_roll(args.x.meta["val"], args.shifts, args.dims)


@lowers("etmlx::roll", check=_check_roll)
def _lower_roll(ctx, node, args):
    axes = [normalize_axis(d, rank_of(args.x)) for d in args.dims]
    ctx.bind(node, ctx.emit(Roll, x=ctx.tensor(args.x), shifts=list(args.shifts), axes=axes))
