"""A method that is one MLX delegate, taking the method's inputs and producing its
outputs, runs on arrays directly: nothing passes through the planned memory, which
would cost a copy in and a copy out on every call for no benefit."""

import numpy as np

from . import pte_types as t
from .dtypes import BFLOAT16
from .method_io import MX, TORCH
from .tensor_value import TensorValue


def direct_runner(plan: t.ExecutionPlan, values: list, handles: list):
    """``run(arrays, kind) -> outputs`` for such a method, else None."""
    if len(plan.instructions) != 1 or not isinstance(plan.instructions[0], t.DelegateCall):
        return None
    call = plan.instructions[0]
    handle = handles[call.delegate_index]
    if not hasattr(handle, "run") or list(call.args) != list(plan.inputs) + list(plan.outputs):
        return None
    outputs = [values[i] for i in plan.outputs]
    if not all(isinstance(v, TensorValue) for v in outputs):
        return None
    bf16_inputs = [isinstance(values[i], TensorValue) and values[i].dtype is BFLOAT16 for i in plan.inputs]

    def run(arrays: list, kind: str) -> list:
        inputs = [_to_mx(a, bf16) if isinstance(a, np.ndarray) else a for a, bf16 in zip(arrays, bf16_inputs)]
        return [_from_mx(out, kind) for out in handle.run(inputs)]

    return run


def _to_mx(array: np.ndarray, bf16: bool):
    import mlx.core as mx

    result = mx.array(array)
    return result.view(mx.bfloat16) if bf16 else result


def _from_mx(array, kind: str):
    """An mx result as ``kind``; bfloat16 crosses numpy as its 16-bit pattern."""
    import mlx.core as mx

    if kind == MX:
        return array
    bf16 = array.dtype == mx.bfloat16
    host = np.array(array.view(mx.uint16) if bf16 else array)
    if kind == TORCH:
        import torch

        tensor = torch.from_numpy(host)
        return tensor.view(torch.bfloat16) if bf16 else tensor
    return host
