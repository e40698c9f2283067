"""``mlx::gather_qmm`` of ExecuTorch's own MLX delegate (its SwitchLinear experts), lowered
straight to ``GatherQmm`` (``mx.gather_qmm``): its operands already are a quantized
stack, each token's matrix picked by ``rhs_indices``. The other ``mlx::`` ops are
rewritten into ATen before decomposition (``fusions/delegate_ops.py``).

The op's reference kernel stores the values signed in int8, or at 4 bits as two unsigned
nibbles a byte (even value low) signed by subtracting 8, and dequantizes each group of
``group_size`` values of a row as ``q * scale + bias``: MLX's affine form with
``Q = q + 2^(bits-1)`` and ``B = bias - 2^(bits-1) * scale``, repacked once at export.
"""

from typing import Optional

import torch

from etmlx.serializer.generated.etmlx_ir import GatherQmm

from ..dtypes import FLOATING
from ..registry import lowers
from .common import dtype_of, example_of
from .indexing import checked_index
from .quantized import BITS, _bitstream, _groups_reason, _mlx_group_size, check_fixed_at_export, nibbles

GATHER_QMM = "mlx::gather_qmm"


def _values(w: torch.Tensor) -> torch.Tensor:
    """The signed values the op's reference reads from ``w``."""
    return nibbles(w) - 8 if w.dtype == torch.uint8 else w.to(torch.int64)


def check_gather_qmm(node, args) -> Optional[str]:
    reason = check_fixed_at_export((args.w, args.scales, args.biases))
    if reason:
        return reason
    if args.mode != "affine":
        return f"mode {args.mode!r} (etmlx lowers the affine mode of mlx::gather_qmm)"
    if args.lhs_indices is not None or args.rhs_indices is None:
        return "lhs_indices, or no rhs_indices (etmlx lowers one matrix per token, picked by rhs_indices)"
    w, scales, x, ids = (example_of(a) for a in (args.w, args.scales, args.x, args.rhs_indices))
    packed = w.dtype == torch.uint8
    if w.dim() != 3 or not (packed and args.bits == 4 or w.dtype == torch.int8 and args.bits in BITS):
        return f"a {w.dim()}-d {w.dtype} stack of {args.bits}-bit values (int8 values, or uint8 nibbles at 4 bits)"
    columns = w.shape[-1] * (2 if packed else 1)
    groups = (*w.shape[:-1], columns // args.group_size)
    if _groups_reason(columns, args.group_size) or tuple(scales.shape) != groups:
        return _groups_reason(columns, args.group_size) or f"scales {tuple(scales.shape)} for groups {groups}"
    if args.biases is not None and tuple(example_of(args.biases).shape) != groups:
        return f"biases {tuple(example_of(args.biases).shape)} for groups {groups}"
    if x.dtype not in FLOATING:
        return f"{x.dtype} activations (MLX's quantized matmuls are floating point)"
    if scales.dtype != x.dtype:
        return f"{scales.dtype} scales with {x.dtype} activations (MLX dequantizes in the activations' dtype)"
    if x.dim() != ids.dim() + 2 or tuple(x.shape[:-2]) != tuple(ids.shape):
        return f"activations {tuple(x.shape)} for indices {tuple(ids.shape)} (one matrix per leading position)"
    return None


@lowers(GATHER_QMM, check=check_gather_qmm)
def _lower_gather_qmm(ctx, node, args):
    values = _values(ctx.constant_values[args.w])
    scales = ctx.constant_values[args.scales].to(torch.float64)
    biases = torch.zeros_like(scales) if args.biases is None else ctx.constant_values[args.biases].to(torch.float64)
    offset = 2 ** (args.bits - 1)
    dtype = dtype_of(args.x)
    repeat = args.group_size // _mlx_group_size(args.group_size)
    fields = dict(
        w=ctx.add_constant(_bitstream(values + offset, args.bits)),
        scales=ctx.add_constant(scales.repeat_interleave(repeat, -1).to(dtype).contiguous()),
        biases=ctx.add_constant((biases - offset * scales).repeat_interleave(repeat, -1).to(dtype).contiguous()),
        groupSize=_mlx_group_size(args.group_size), bits=args.bits,
    )
    ids = checked_index(ctx, args.rhs_indices, args.w, 0, wraps=False)
    ctx.bind(node, ctx.emit(GatherQmm, x=ctx.tensor(args.x), rhsIndices=ids, transpose=args.transpose, **fields))
