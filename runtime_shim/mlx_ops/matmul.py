import math

import mlx.core as mx


def clamped_expert_indices(indices: mx.array, experts: int, what: str) -> mx.array:
    """``indices`` clamped into [0, experts): MLX reads whatever memory an index points
    at (lowering only fuses indices that are in range by construction, a router's top-k)."""
    if not mx.issubdtype(indices.dtype, mx.integer):
        raise TypeError(f"{what} indices of dtype {indices.dtype}")
    if experts <= 0:
        raise ValueError(f"{what} over a stack of no matrices")
    if indices.dtype not in (mx.int32, mx.int64):
        indices = indices.astype(mx.int64)
    return mx.clip(indices, 0, experts - 1)


def _gather_mm(op, env):
    """``a[i] @ b[rhs_indices[i]]``, the indices clamped into b's matrices. MLX's CPU
    gather_mm takes float32 only: other dtypes on the CPU gather the matrices and
    multiply, as the unfused graph does."""
    a, b = env.t(op.a), env.t(op.b)
    if b.ndim != 3:
        raise ValueError(f"gather_mm over weights of shape {tuple(b.shape)}: expected (experts, K, N)")
    indices = clamped_expert_indices(env.t(op.rhsIndices), b.shape[0], "gather_mm")
    if mx.default_device() == mx.cpu and b.dtype != mx.float32:
        return mx.matmul(a, mx.take(b, indices, axis=0))
    return mx.gather_mm(a, b, rhs_indices=indices)


# MLX's CPU matmul of bfloat16 or float16 operands is a scalar loop: at 128 rows of 2048
# by 8192 columns, bfloat16 took 780 ms and float32 (BLAS) 80. From this many rows of a
# on, the CPU multiplies in float32 and rounds the product back once (both accumulate in
# float32; about 1 value in 4000 lands one rounding apart) (docs/architecture.md, "MLX traps").
CPU_WIDENED_ROWS = 8


def half_on_cpu(x) -> bool:
    """Whether ``x`` is bfloat16 or float16 on the CPU, where MLX's products of it are slow."""
    return mx.default_device() == mx.cpu and x.dtype in (mx.bfloat16, mx.float16)


def widened_on_cpu(a, b) -> bool:
    return half_on_cpu(a) and b.dtype == a.dtype and a.ndim >= 2 and a.shape[-2] >= CPU_WIDENED_ROWS


def product(a, b):
    """``a @ b``, widened where ``widened_on_cpu`` says."""
    if widened_on_cpu(a, b):
        return mx.matmul(a.astype(mx.float32), b.astype(mx.float32)).astype(a.dtype)
    return mx.matmul(a, b)


def _stored_rows(a, b, ref, env):
    """(the matrix ``b`` views transposed, ``a`` as a column) where ``a @ b`` is one
    float32 row times such a view on the CPU: a linear layer's weight, stored as the
    checkpoint holds it, (out, in), in a decode step. There BLAS's product of a row with
    a transposed operand read a decode step's weights at ~2/3 of the speed of the
    matrix-vector product over the stored rows, ``W @ a``, which this is (hidden 1024,
    8 layers, OpenBLAS: 30 -> 20 ms of products a token; docs/architecture.md, "MLX
    traps"). None elsewhere: bfloat16 and float16 run MLX's own loops; over more rows
    ``W @ a^T`` was faster in most calls but not steadily (a 5-row call 41 ms, then 94
    ms in later runs), the view's product steady."""
    if (ref.idx not in env.transposed_matrices or mx.default_device() != mx.cpu or a.dtype != mx.float32
            or b.dtype != mx.float32 or a.ndim == 0 or math.prod(a.shape[:-1]) != 1):
        return None
    return mx.transpose(b), a.reshape(-1, 1)


def _addmm(op, env):
    c, a, b = env.t(op.c), env.t(op.a), env.t(op.b)
    stored = _stored_rows(a, b, op.b, env)
    if stored is not None and c.size in (1, b.shape[-1]):
        matrix, column = stored
        return mx.addmm(c.reshape(-1, 1), matrix, column, alpha=op.alpha, beta=op.beta).reshape(a.shape[0], matrix.shape[0])
    if widened_on_cpu(a, b) and c.dtype == a.dtype:
        wide = [t.astype(mx.float32) for t in (c, a, b)]
        return mx.addmm(*wide, alpha=op.alpha, beta=op.beta).astype(a.dtype)
    return mx.addmm(c, a, b, alpha=op.alpha, beta=op.beta)


def _matmul(op, env):
    """``a @ b``; over an inner size of 1 (an outer product: a state-space scan's update
    in a decode step) as the broadcast product it equals, which ``mx.compile``
    fuses with its neighbours instead of a matmul per batch entry and a buffer between."""
    a, b = env.t(op.a), env.t(op.b)
    if a.ndim >= 2 and b.ndim >= 2 and a.shape[-1] == 1 and b.shape[-2] == 1:
        return a * b
    stored = _stored_rows(a, b, op.b, env)
    if stored is not None:
        matrix, column = stored
        return mx.matmul(matrix, column).reshape(*a.shape[:-1], matrix.shape[0])
    return product(a, b)


HANDLERS = {
    "Matmul": _matmul,
    "Addmm": _addmm,
    "GatherMm": _gather_mm,
}
