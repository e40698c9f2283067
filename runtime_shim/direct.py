"""A method that is one MLX delegate, taking the method's inputs and producing its
outputs, runs on arrays directly: nothing passes through the planned memory, which
would cost a copy in and a copy out on every call for no benefit.

The delegate may also take sizes that ExecuTorch's scalar ops read from an input's
values first (``etmlx.llm.causal_lm``'s attention window: ``cache_position[-1].item()`` and
its arithmetic): that prologue runs here on the host, on the arrays themselves."""

import numpy as np

from . import pte_types as t
from .dtypes import BFLOAT16
from .method_io import MX, TORCH
from .prim_ops import KERNELS
from .tensor_value import TensorValue


def direct_runner(plan: t.ExecutionPlan, values: list, handles: list):
    """``run(arrays, kind) -> outputs`` for such a method, else None."""
    *prologue, call = plan.instructions or [None]
    if not isinstance(call, t.DelegateCall):
        return None
    steps = [_size_read(plan.operators[ins.op_index], ins.args) if isinstance(ins, t.KernelCall) else None
             for ins in prologue]
    handle = handles[call.delegate_index]
    arguments = list(call.args[: len(call.args) - len(plan.outputs)])
    sizes = [i for i in arguments if i not in plan.inputs]
    if None in steps or not hasattr(handle, "run") or list(call.args[len(arguments):]) != list(plan.outputs):
        return None
    if any(isinstance(values[i], TensorValue) for i in sizes):
        return None
    outputs = [values[i] for i in plan.outputs]
    if not all(isinstance(v, TensorValue) for v in outputs):
        return None
    bf16 = {i: isinstance(values[i], TensorValue) and values[i].dtype is BFLOAT16 for i in plan.inputs}

    def run(arrays: list, kind: str) -> list:
        scratch = dict(zip(plan.inputs, arrays))
        for step in steps:
            step(values, scratch)
        inputs = [_to_mx(scratch[i], bf16[i]) if isinstance(scratch[i], np.ndarray) else scratch[i] for i in arguments]
        return [_from_mx(out, kind) for out in handle.run(inputs)]

    return run


def _size_read(op: t.Operator, args: tuple):
    """``step(values, scratch)`` for a scalar op of a size prologue, else None: one element
    of an input (``select_copy``), its value (``_local_scalar_dense``), ExecuTorch's
    integer arithmetic. Results go to ``scratch``; constants are read from ``values``."""

    def read(values, scratch, index):
        return scratch[index] if index in scratch else values[index]

    if op.qualified == "aten::select_copy.int_out":
        src, dim, index, out, _ = args

        def select(values, scratch):
            array, at = np.asarray(read(values, scratch, src)), read(values, scratch, index)
            axis = read(values, scratch, dim)
            if not -array.shape[axis] <= at < array.shape[axis]:
                raise IndexError(f"select(): index {at} out of range for a dimension of size {array.shape[axis]}")
            scratch[out] = np.take(array, at, axis=axis)

        return select
    if op.qualified == "aten::_local_scalar_dense.default":
        src, out = args

        def item(values, scratch):
            scratch[out] = np.asarray(read(values, scratch, src)).item()

        return item
    if op.name.startswith("executorch_prim::") and op.qualified in KERNELS and "et_" not in op.name:
        kernel, _ = KERNELS[op.qualified]

        def arithmetic(values, scratch):
            table = _Overlay(values, scratch)
            kernel(table, args)

        return arithmetic
    return None


class _Overlay:
    """The method's values with this call's results on top: what a prim kernel reads and writes."""

    def __init__(self, values, scratch):
        self.values, self.scratch = values, scratch

    def __getitem__(self, index):
        return self.scratch[index] if index in self.scratch else self.values[index]

    def __setitem__(self, index, value):
        self.scratch[index] = value


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
