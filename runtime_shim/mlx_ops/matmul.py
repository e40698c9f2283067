import mlx.core as mx


def _gather_mm(op, env):
    """``a[i] @ b[rhs_indices[i]]``; the indices are clamped into b's experts first:
    MLX reads whatever memory an index points at (lowering only fuses indices that are
    in range by construction, a router's top-k). MLX's CPU gather_mm takes float32
    only: other dtypes on the CPU gather the matrices and multiply, as the unfused
    graph does."""
    a, b, indices = env.t(op.a), env.t(op.b), env.t(op.rhsIndices)
    if b.ndim != 3 or b.shape[0] == 0:
        raise ValueError(f"gather_mm over weights of shape {tuple(b.shape)}: expected (experts, K, N)")
    if not mx.issubdtype(indices.dtype, mx.integer):
        raise TypeError(f"gather_mm indices of dtype {indices.dtype}")
    if indices.dtype not in (mx.int32, mx.int64):
        indices = indices.astype(mx.int64)
    indices = mx.clip(indices, 0, b.shape[0] - 1)
    if mx.default_device() == mx.cpu and b.dtype != mx.float32:
        return mx.matmul(a, mx.take(b, indices, axis=0))
    return mx.gather_mm(a, b, rhs_indices=indices)


HANDLERS = {
    "Matmul": lambda op, env: mx.matmul(env.t(op.a), env.t(op.b)),
    "Addmm": lambda op, env: mx.addmm(env.t(op.c), env.t(op.a), env.t(op.b), alpha=op.alpha, beta=op.beta),
    "GatherMm": _gather_mm,
}
