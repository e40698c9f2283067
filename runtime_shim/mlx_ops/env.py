"""The values of one delegate call: tensor slots and int slots."""

import mlx.core as mx

from etmlx.serializer.ir import TORCH_DTYPE_NAMES

MX_DTYPES = {dtype: getattr(mx, "bool_" if name == "bool" else name) for dtype, name in TORCH_DTYPE_NAMES.items()}


def floating_operand(x: mx.array, what: str) -> mx.array:
    """The operand of a node PyTorch computes on floating-point tensors only (averages,
    variance, log-softmax), whose result is cast back to the operand's dtype. An integer
    operand comes only from a malformed payload, and the cast of its float result (inf,
    NaN) would be undefined behaviour in the code mx.compile generates."""
    if not mx.issubdtype(x.dtype, mx.floating):
        raise ValueError(f"{what} of a tensor that is not floating-point")
    return x


def fill_value(op) -> mx.array:
    """The 0-d array of a Scalar or Full node: exact int64 for integer dtypes."""
    dtype = MX_DTYPES[op.dtype]
    value = op.value if mx.issubdtype(dtype, mx.floating) else op.intValue
    return mx.array(value, dtype=dtype)


class Env:
    __slots__ = ("tensors", "ints", "checks", "transposed_matrices", "_shared")

    def __init__(self, num_tensors: int, num_ints: int, transposed_matrices: frozenset = frozenset()):
        self.tensors = [None] * num_tensors
        self.ints = [0] * num_ints
        # Slots holding a constant 2-D matrix's transposed view, made once at load (a
        # linear layer's weight, stored as the checkpoint holds it): matmul.py reads the
        # matrix as stored where that is faster.
        self.transposed_matrices = transposed_matrices
        # Per CheckIndex run, in node order: (its indices, the size of the axis they
        # index), checked on the host once the call is evaluated.
        self.checks = []
        self._shared = {}

    def shared(self, key: tuple, make):
        """What ``make()`` returns, made once per call for ``key``: values several nodes
        derive alike from the same slots (the angles of Rope nodes at the same positions)."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def t(self, ref) -> mx.array:
        return self.tensors[ref.idx]

    def size(self, ref) -> int:
        return self.ints[ref.value] if ref.isSlot else ref.value

    def sizes(self, refs) -> list:
        return [self.size(ref) for ref in refs]
