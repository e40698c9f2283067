"""Weight-only quantized kernels: QuantizedMatmul (a linear layer's weight), Dequantize
(rows gathered from a quantized embedding) and GatherQmm (quantized experts). MLX checks that the packed
weights, scales and biases agree in shape and dtype; the parameters are checked here."""

import mlx.core as mx

from etmlx.serializer.constants import QUANTIZED_BITS as BITS
from etmlx.serializer.constants import QUANTIZED_GROUP_SIZES as GROUP_SIZES

from .matmul import clamped_expert_indices


def _parameters(op) -> dict:
    if op.bits not in BITS or op.groupSize not in GROUP_SIZES:
        raise ValueError(f"quantized weights of {op.bits} bits in groups of {op.groupSize} (etmlx writes bits "
                         f"{', '.join(map(str, BITS))} and groups of {', '.join(map(str, GROUP_SIZES))})")
    return dict(group_size=op.groupSize, bits=op.bits)


def _gather_qmm(op, env):
    w = env.t(op.w)
    if w.ndim != 3:
        raise ValueError(f"gather_qmm over packed weights of shape {tuple(w.shape)}: expected (experts, N, K packed)")
    indices = clamped_expert_indices(env.t(op.rhsIndices), w.shape[0], "gather_qmm")
    return mx.gather_qmm(
        env.t(op.x), w, env.t(op.scales), env.t(op.biases), rhs_indices=indices, transpose=op.transpose,
        **_parameters(op),
    )


HANDLERS = {
    "QuantizedMatmul": lambda op, env: mx.quantized_matmul(
        env.t(op.x), env.t(op.w), env.t(op.scales), env.t(op.biases), transpose=True, **_parameters(op)
    ),
    "Dequantize": lambda op, env: mx.dequantize(env.t(op.w), env.t(op.scales), env.t(op.biases), **_parameters(op)),
    "GatherQmm": _gather_qmm,
}
