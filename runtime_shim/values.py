"""Materialize the EValues of one execution plan, honouring its memory plan.

Each memory id gets one zeroed arena of ``non_const_buffer_sizes[id]`` bytes and
every planned tensor is a view of it at its offset, so values the planner put at
the same offset alias (ExecuTorch elides static views this way: two values, one
offset, no instruction between them). Constants view the file's constant data;
mutable buffers with a serialized initial value get it copied in once, here.
"""

import math

import numpy as np

from . import pte_types as t
from .dtypes import from_scalar_type
from .errors import PteFormatError
from .pte_file import PteFile
from .tensor_value import TensorValue


def build_values(plan: t.ExecutionPlan, pte: PteFile) -> list:
    """The runtime value table: TensorValue for tensors, the decoded records otherwise."""
    arenas = [np.zeros(size, np.uint8) for size in plan.non_const_buffer_sizes]
    values = []
    for index, value in enumerate(plan.values):
        if isinstance(value, t.TensorMeta):
            try:
                value = _tensor(value, arenas, pte)
            except PteFormatError as e:
                raise PteFormatError(f"method {plan.name!r}, value {index}: {e}") from None
        values.append(value)
    return values


def _tensor(meta: t.TensorMeta, arenas: list, pte: PteFile) -> TensorValue:
    dtype = from_scalar_type(meta.scalar_type)
    if meta.external_key is not None:
        raise PteFormatError(f"tensor data {meta.external_key!r} lives in an external .ptd file, which is not supported")
    if len(meta.dim_order) not in (0, len(meta.sizes)) or sorted(meta.dim_order) != list(range(len(meta.dim_order))):
        raise PteFormatError(f"dim_order {meta.dim_order} is not a permutation for sizes {meta.sizes}")
    nbytes = math.prod(meta.sizes) * dtype.itemsize
    storage = None
    if meta.allocation is not None:
        storage = _planned(meta.allocation, nbytes, arenas)
        if meta.data_buffer_idx > 0:
            storage[:] = pte.mutable_initial(meta.mutable_segment, meta.data_buffer_idx, nbytes)
    elif meta.data_buffer_idx > 0:
        storage = pte.constant(meta.data_buffer_idx, nbytes)
    return TensorValue(dtype, meta.sizes, meta.dim_order, meta.dynamism, storage)


def _planned(alloc: t.Allocation, nbytes: int, arenas: list) -> np.ndarray:
    if not 0 <= alloc.memory_id < len(arenas):
        raise PteFormatError(f"memory id {alloc.memory_id} out of range ({len(arenas)} planned buffers)")
    arena = arenas[alloc.memory_id]
    if alloc.offset + nbytes > len(arena):
        raise PteFormatError(
            f"planned bytes {alloc.offset}..{alloc.offset + nbytes} exceed memory {alloc.memory_id}"
            f" of {len(arena)} bytes"
        )
    return arena[alloc.offset : alloc.offset + nbytes]
