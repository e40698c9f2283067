"""The values of one delegate call: tensor slots and int slots."""

import mlx.core as mx
import numpy as np

from etmlx.serializer.generated.etmlx_ir.DType import DType

MX_DTYPES = {
    DType.Bool: mx.bool_,
    DType.UInt8: mx.uint8,
    DType.Int8: mx.int8,
    DType.Int16: mx.int16,
    DType.Int32: mx.int32,
    DType.Int64: mx.int64,
    DType.Float16: mx.float16,
    DType.BFloat16: mx.bfloat16,
    DType.Float32: mx.float32,
}

# How a constant's bytes are laid out in the .pte; bfloat16 as its 16-bit pattern.
NUMPY_STORAGE = {
    DType.Bool: np.bool_,
    DType.UInt8: np.uint8,
    DType.Int8: np.int8,
    DType.Int16: np.int16,
    DType.Int32: np.int32,
    DType.Int64: np.int64,
    DType.Float16: np.float16,
    DType.BFloat16: np.uint16,
    DType.Float32: np.float32,
}


def fill_value(op) -> mx.array:
    """The 0-d array of a Scalar or Full node: exact int64 for integer dtypes."""
    dtype = MX_DTYPES[op.dtype]
    value = op.value if mx.issubdtype(dtype, mx.floating) else op.intValue
    return mx.array(value, dtype=dtype)


class Env:
    __slots__ = ("tensors", "ints", "checks")

    def __init__(self, num_tensors: int, num_ints: int):
        self.tensors = [None] * num_tensors
        self.ints = [0] * num_ints
        # Per CheckIndex run, in node order: (its indices, the size of the axis they
        # index), checked on the host once the call is evaluated.
        self.checks = []

    def t(self, ref) -> mx.array:
        return self.tensors[ref.idx]

    def size(self, ref) -> int:
        return self.ints[ref.value] if ref.isSlot else ref.value

    def sizes(self, refs) -> list:
        return [self.size(ref) for ref in refs]
