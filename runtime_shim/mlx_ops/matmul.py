import mlx.core as mx

HANDLERS = {
    "Matmul": lambda op, env: mx.matmul(env.t(op.a), env.t(op.b)),
    "Addmm": lambda op, env: mx.addmm(env.t(op.c), env.t(op.a), env.t(op.b), alpha=op.alpha, beta=op.beta),
}
