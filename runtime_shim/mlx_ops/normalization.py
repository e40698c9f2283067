import mlx.core as mx

from . import cpu_math
from .env import floating_operand


def _layer_norm(op, env):
    weight = env.t(op.weight) if op.hasWeight else None
    bias = env.t(op.bias) if op.hasBias else None
    return mx.fast.layer_norm(env.t(op.x), weight, bias, op.eps)


def _log_softmax(op, env):
    x = floating_operand(env.t(op.x), "log-softmax")
    wide = x.astype(mx.float32)  # PyTorch accumulates half-precision log-softmax in float32
    return (wide - mx.logsumexp(wide, axis=op.axis, keepdims=True)).astype(x.dtype)


def _softmax(op, env):
    """MLX's softmax, or on MLX's CPU the faster form of ``cpu_math``."""
    x = env.t(op.x)
    if mx.default_device() == mx.cpu and x.dtype in cpu_math.NARROW_FLOATS:
        return cpu_math.softmax(x, op.axis)
    return mx.softmax(x, axis=op.axis, precise=True)


def _rms_norm(op, env):
    return mx.fast.rms_norm(env.t(op.x), env.t(op.weight) if op.hasWeight else None, op.eps)


HANDLERS = {
    "RmsNorm": _rms_norm,
    "Softmax": _softmax,
    "LogSoftmax": _log_softmax,
    "LayerNorm": _layer_norm,
}
