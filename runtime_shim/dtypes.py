"""ExecuTorch ScalarType ints and their numpy / torch / mlx counterparts, in one place.

numpy has no bfloat16, so bfloat16 tensors are held as uint16 numpy arrays holding
the same bits; ``torch_dtype`` gives the real bfloat16 type for a ``.view()`` of those
bits.
"""

from dataclasses import dataclass

import numpy as np

from .errors import PteFormatError


@dataclass(frozen=True)
class DType:
    scalar_type: int
    name: str  # torch's spelling: torch.<name> and mlx.core.<name>
    numpy: np.dtype  # storage dtype; uint16 for bfloat16

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    def torch_dtype(self):
        import torch

        return getattr(torch, self.name)


_TABLE = [
    DType(0, "uint8", np.dtype(np.uint8)),
    DType(1, "int8", np.dtype(np.int8)),
    DType(2, "int16", np.dtype(np.int16)),
    DType(3, "int32", np.dtype(np.int32)),
    DType(4, "int64", np.dtype(np.int64)),
    DType(5, "float16", np.dtype(np.float16)),
    DType(6, "float32", np.dtype(np.float32)),
    DType(7, "float64", np.dtype(np.float64)),
    DType(11, "bool", np.dtype(np.bool_)),
    DType(15, "bfloat16", np.dtype(np.uint16)),
    DType(27, "uint16", np.dtype(np.uint16)),
    DType(28, "uint32", np.dtype(np.uint32)),
    DType(29, "uint64", np.dtype(np.uint64)),
]
_BY_SCALAR_TYPE = {d.scalar_type: d for d in _TABLE}

BFLOAT16 = _BY_SCALAR_TYPE[15]


def from_scalar_type(scalar_type: int) -> DType:
    try:
        return _BY_SCALAR_TYPE[scalar_type]
    except KeyError:
        raise PteFormatError(
            f"unsupported tensor scalar type {scalar_type} (supported: "
            + ", ".join(f"{d.scalar_type}={d.name}" for d in _TABLE)
            + ")"
        ) from None
