"""Inputs in, outputs out: check inputs against a plan and convert between kinds.

Inputs may be torch tensors, numpy arrays or mlx arrays (and Python scalars for
scalar inputs). Inside, every tensor is numpy (bfloat16 as uint16 bits): torch
tensors on another device are copied to the host, strided ones are read as PyTorch
reads them. Outputs are copies, returned as the kind of the first tensor input: the
arena they come from is overwritten by the next call.
"""

import numpy as np

from . import pte_types as t
from .dtypes import BFLOAT16, DType, from_scalar_type
from .errors import InputError
from .tensor_value import TensorValue, is_mx_array, is_torch_tensor

NUMPY, TORCH, MX = "numpy", "torch", "mx"


def kind_of(x) -> str | None:
    if is_torch_tensor(x):
        return TORCH
    if is_mx_array(x):
        return MX
    if isinstance(x, np.ndarray):
        return NUMPY
    return None


def _dtype_name(x, kind: str) -> str:
    if kind == NUMPY:
        return x.dtype.name
    return str(x.dtype).rsplit(".", 1)[-1]  # torch.float32 / mlx.core.float32


def _to_numpy(x, kind: str) -> np.ndarray:
    """Tensor contents as numpy, bfloat16 as uint16 bits (a copy only when needed)."""
    if kind == TORCH:
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            import torch

            x = x.view(torch.uint16)
        return x.numpy()
    if kind == MX:
        import mlx.core as mx

        if x.dtype == mx.bfloat16:
            x = x.view(mx.uint16)
        return np.array(x)
    return x


def _accepts_dtype(expected: DType, got: str, kind: str) -> bool:
    # numpy has no bfloat16: numpy callers pass bfloat16 inputs as uint16 bits.
    return got == expected.name or (kind == NUMPY and expected is BFLOAT16 and got == "uint16")


def _expected_shape(tv: TensorValue) -> str:
    if tv.dynamism == t.STATIC:
        dims = [str(c) for c in tv.capacity]
    else:
        dims = [f"<={c}" if tv.dynamism == t.DYNAMIC_BOUND else "?" for c in tv.capacity]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _fits(tv: TensorValue, shape: tuple) -> bool:
    if len(shape) != len(tv.capacity):
        return False
    if tv.dynamism == t.STATIC:
        return shape == tv.capacity
    if tv.dynamism == t.DYNAMIC_BOUND:
        return all(s <= c for s, c in zip(shape, tv.capacity))
    return True


_SCALAR_TYPES = {int: (int,), float: (float, int), bool: (bool,), str: (str,)}


def check_inputs(method: str, expected: list, inputs) -> list:
    """Validate ``inputs`` against the plan's input values; returns numpy arrays / scalars.

    ``expected`` holds the method's current input values (TensorValue or scalars).
    """
    inputs = list(inputs)
    if len(inputs) != len(expected):
        raise InputError(f"{method}: expected {len(expected)} inputs, got {len(inputs)}")
    converted = []
    for i, (want, x) in enumerate(zip(expected, inputs)):
        where = f"{method}: input {i}"
        if isinstance(want, TensorValue):
            kind = kind_of(x)
            if kind is None:
                raise InputError(f"{where} is a {type(x).__name__}, expected a {want.dtype.name} tensor")
            got = _dtype_name(x, kind)
            if not _accepts_dtype(want.dtype, got, kind):
                raise InputError(f"{where} has dtype {got}, expected {want.dtype.name}")
            shape = tuple(x.shape)
            if not _fits(want, shape):
                raise InputError(f"{where} has shape {shape}, expected {_expected_shape(want)}")
            if kind == TORCH and x.device.type == "meta":
                raise InputError(f"{where} is a meta tensor, which holds no data")
            converted.append(_to_numpy(x, kind))
        else:
            allowed = _SCALAR_TYPES.get(type(want), ())
            if type(x) not in allowed:
                raise InputError(f"{where} is a {type(x).__name__}, expected a {type(want).__name__}")
            converted.append(type(want)(x))
    return converted


def output_kind(inputs) -> str:
    """The kind of the first tensor input; numpy when there is none."""
    for x in inputs:
        kind = kind_of(x)
        if kind is not None:
            return kind
    return NUMPY


def convert_output(value, kind: str):
    """A copy of an output value, as ``kind``; non-tensors pass through."""
    if not isinstance(value, TensorValue):
        return value
    array = np.array(value.array, copy=True)  # contiguous, independent of the arena
    return _from_numpy(array, value.dtype is BFLOAT16, kind)


def convert_torch_output(tensor, kind: str):
    """A torch output (ExecuTorch's runtime returns those) as ``kind``."""
    if kind == TORCH or not is_torch_tensor(tensor):
        return tensor
    import torch

    bf16 = tensor.dtype == torch.bfloat16
    return _from_numpy((tensor.view(torch.uint16) if bf16 else tensor).numpy(), bf16, kind)


def _from_numpy(array: np.ndarray, bf16: bool, kind: str):
    """``array`` (bfloat16 as uint16 bits) as ``kind``, sharing its memory where it can."""
    if kind == TORCH:
        import torch

        tensor = torch.from_numpy(array)
        return tensor.view(torch.bfloat16) if bf16 else tensor
    if kind == MX:
        import mlx.core as mx

        a = mx.array(array)
        return a.view(mx.bfloat16) if bf16 else a
    return array


def expected_inputs(plan: t.ExecutionPlan) -> list:
    """What ``check_inputs`` compares a method's inputs with, from the plan alone: a
    TensorValue without memory per tensor input, the serialized value otherwise."""
    expected = []
    for index in plan.inputs:
        value = plan.values[index]
        if isinstance(value, t.TensorMeta):
            value = TensorValue(from_scalar_type(value.scalar_type), value.sizes, value.dim_order, value.dynamism, None)
        expected.append(value)
    return expected
