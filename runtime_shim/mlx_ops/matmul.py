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


def _matmul(op, env):
    """``a @ b``; over an inner size of 1 (an outer product: a state-space scan's update
    in a decode step) as the broadcast product it equals, which ``mx.compile``
    fuses with its neighbours instead of a matmul per batch entry and a buffer between."""
    a, b = env.t(op.a), env.t(op.b)
    if a.ndim >= 2 and b.ndim >= 2 and a.shape[-1] == 1 and b.shape[-2] == 1:
        return a * b
    return mx.matmul(a, b)


HANDLERS = {
    "Matmul": _matmul,
    "Addmm": lambda op, env: mx.addmm(env.t(op.c), env.t(op.a), env.t(op.b), alpha=op.alpha, beta=op.beta),
    "GatherMm": _gather_mm,
}
