"""Resampling that is one fixed linear map per spatial axis -- antialiased resizing,
adaptive average pooling of sizes that do not divide -- lowered, for static sizes, as
one matmul per axis. Each axis's matrix is computed at export by PyTorch's own kernel
applied to an identity, so its weights are PyTorch's, whatever its kernel's formula."""

import torch

from etmlx.serializer.generated.etmlx_ir import AsType, Matmul, Transpose

from ..dtypes import ir_dtype
from .common import as_dtype, out_dtype, rank_of


def axis_matrices(resample, sizes: list, outputs: list) -> list:
    """Per spatial axis, the (output, input) float32 matrix of ``resample(x, axis,
    output_sizes)`` (x channels-first), computed in float64 from a batch of unit
    impulses along the axis. The other axes keep a size of 2, which every resampling
    maps to itself: at size 1 a (n, 1, n, 1) batch is also channels-last, and PyTorch's
    antialiased kernels then read it wrongly."""
    matrices = []
    spatial = len(sizes)
    for axis, (n, m) in enumerate(zip(sizes, outputs)):
        shape = [n, 1] + [n if a == axis else 1 for a in range(spatial)]
        impulses = torch.eye(n, dtype=torch.float64).reshape(shape)
        impulses = impulses.expand([n, 2] + [n if a == axis else 2 for a in range(spatial)]).contiguous()
        responses = resample(impulses, axis, [m if a == axis else 2 for a in range(spatial)])
        first = (slice(None), 0) + tuple(slice(None) if a == axis else 0 for a in range(spatial))
        matrices.append(responses[first].T.to(torch.float32).contiguous())
    return matrices


def lower_per_axis(ctx, node, x, matrices: list) -> None:
    """Binds ``node`` to ``x`` times each spatial axis's matrix (the last axes of ``x``,
    batched or not), in float32."""
    rank, dtype = rank_of(x), out_dtype(node)
    out = as_dtype(ctx, x, torch.float32)
    for axis, matrix in enumerate(matrices, start=rank - len(matrices)):
        if axis == rank - 1:  # (.., n) @ (n, m)
            out = ctx.emit(Matmul, a=out, b=ctx.add_constant(matrix.T.contiguous()))
        elif axis == rank - 2:  # (m, n) @ (.., n, w)
            out = ctx.emit(Matmul, a=ctx.add_constant(matrix), b=out)
        else:  # the axis last, then back
            order = [a for a in range(rank) if a != axis] + [axis]
            out = ctx.emit(Transpose, x=out, perm=order)
            out = ctx.emit(Matmul, a=out, b=ctx.add_constant(matrix.T.contiguous()))
            out = ctx.emit(Transpose, x=out, perm=[order.index(a) for a in range(rank)])
    ctx.bind(node, out if dtype == torch.float32 else ctx.emit(AsType, x=out, dtype=ir_dtype(dtype)))
