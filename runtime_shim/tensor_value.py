"""TensorValue: one tensor of an execution plan, a typed view over planned memory.

A TensorValue owns no memory of its own when it is memory planned: its storage is
a byte range of its method's arena (or of the constant data), so two values planned
at the same offset see each other's writes, exactly as in the ExecuTorch runtime.
Its ``shape`` is the current shape, which for dynamic tensors changes per call
within ``capacity`` (the serialized upper-bound sizes).

This is also the object backends receive for tensor arguments of a DelegateCall:
read inputs with ``.array`` (or ``.to_mx()``), write outputs with ``.set(...)``
(or ``.set_mx(...)``).
"""

import math
import sys

import numpy as np

from . import pte_types as t
from .dtypes import BFLOAT16, DType
from .errors import CapacityError


class TensorValue:
    __slots__ = ("dtype", "capacity", "dim_order", "dynamism", "shape", "_storage", "_torch_storage")

    def __init__(self, dtype: DType, capacity: tuple, dim_order: tuple, dynamism: int, storage: np.ndarray | None):
        self.dtype = dtype
        self.capacity = tuple(capacity)
        self.dim_order = tuple(dim_order) or tuple(range(len(capacity)))
        self.dynamism = dynamism
        self.shape = self.capacity
        self._storage = storage  # uint8 view; None until first needed if not planned
        self._torch_storage = None  # torch uint8 tensor over _storage, made on first use

    # -- metadata ---------------------------------------------------------

    @property
    def scalar_type(self) -> int:
        """ExecuTorch ScalarType int (6 = float32, 15 = bfloat16, ...)."""
        return self.dtype.scalar_type

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __repr__(self) -> str:
        return (
            f"TensorValue({self.dtype.name}, shape={self.shape}, capacity={self.capacity},"
            f" {t.DYNAMISM_NAMES.get(self.dynamism, self.dynamism)})"
        )

    # -- memory -----------------------------------------------------------

    @property
    def storage(self) -> np.ndarray:
        """The uint8 bytes backing this tensor; unplanned tensors get private memory."""
        if self._storage is None:
            self._bind(np.zeros(math.prod(self.capacity) * self.dtype.itemsize, np.uint8))
        return self._storage

    def _bind(self, storage: np.ndarray) -> None:
        self._storage = storage
        self._torch_storage = None

    def _is_default_order(self) -> bool:
        return all(d == i for i, d in enumerate(self.dim_order))

    def _physical(self, shape: tuple) -> tuple:
        return tuple(shape[d] for d in self.dim_order)

    def _logical_axes(self) -> tuple:
        """Axes that turn the physical (dim-ordered) layout back into logical order."""
        return tuple(int(i) for i in np.argsort(self.dim_order))

    def resize(self, shape) -> None:
        """Change the current shape, within the planned capacity."""
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return
        if len(shape) != len(self.capacity):
            raise CapacityError(f"cannot resize a rank-{len(self.capacity)} tensor to shape {shape}")
        if self.dynamism == t.STATIC and shape != self.capacity:
            raise CapacityError(f"cannot resize a static tensor of shape {self.capacity} to {shape}")
        if self.dynamism == t.DYNAMIC_BOUND and any(s > c for s, c in zip(shape, self.capacity)):
            raise CapacityError(f"shape {shape} exceeds the planned upper bound {self.capacity}")
        needed = math.prod(shape) * self.dtype.itemsize
        if needed > len(self.storage):
            if self.dynamism != t.DYNAMIC_UNBOUND:
                raise CapacityError(f"shape {shape} needs {needed} bytes; {len(self.storage)} are planned")
            self._bind(np.zeros(needed, np.uint8))
        self.shape = shape

    def alias(self, other: "TensorValue", shape) -> None:
        """Make this tensor a view of ``other``'s memory with ``shape`` (et_view)."""
        self._bind(other.storage)
        self.shape = None  # so resize() checks the new shape against the new storage
        self.resize(shape)

    # -- numpy ------------------------------------------------------------

    @property
    def array(self) -> np.ndarray:
        """A numpy view of the current contents (bfloat16 as uint16 bits)."""
        flat = self.storage[: self.nbytes].view(self.dtype.numpy)
        if self._is_default_order():
            return flat.reshape(self.shape)
        return flat.reshape(self._physical(self.shape)).transpose(self._logical_axes())

    def set(self, array, shape=None) -> None:
        """Resize to ``shape`` (default: the array's shape) and copy ``array`` in.

        ``array`` must have this tensor's numpy dtype (uint16 bits for bfloat16).
        Raises CapacityError when the shape does not fit the planned memory.
        """
        array = np.asarray(array)
        if array.dtype != self.dtype.numpy:
            raise TypeError(
                f"cannot set a {self.dtype.name} tensor from a {array.dtype} array"
                + (" (bfloat16 tensors take uint16 bits)" if self.dtype is BFLOAT16 else "")
            )
        shape = array.shape if shape is None else tuple(shape)
        if math.prod(shape) != array.size:
            raise ValueError(f"array of {array.size} elements does not fit shape {tuple(shape)}")
        self.resize(shape)
        self.array[...] = array.reshape(shape)

    def item(self):
        """The single element as a Python number (bfloat16 decoded)."""
        value = self.array.reshape(-1)
        if value.size != 1:
            raise ValueError(f"item() of a tensor with {value.size} elements")
        if self.dtype is BFLOAT16:
            return float((value.astype(np.uint32) << 16).view(np.float32)[0])
        return value[0].item()

    # -- torch ------------------------------------------------------------

    def _torch_typed(self):
        """A 1-D torch tensor of this dtype over the whole storage (shared memory)."""
        if self._torch_storage is None:
            import torch

            self._torch_storage = torch.from_numpy(self.storage)
        return self._torch_storage.view(self.dtype.torch_dtype())

    def to_torch(self):
        """A torch tensor sharing this tensor's memory, in its current shape."""
        flat = self._torch_typed()[: self.numel]
        if self._is_default_order():
            return flat.view(self.shape)
        return flat.view(self._physical(self.shape)).permute(self._logical_axes())

    def torch_out(self):
        """A torch tensor to pass as ``out=``: a kernel may resize it within the storage.

        Dynamic tensors are passed with zero elements so torch resizes them to the
        result shape without its "resized a non-empty output" warning; the storage
        is not resizable, so torch fails rather than write past the planned bytes.
        """
        if self.dynamism != t.STATIC and self._is_default_order():
            return self._torch_typed()[:0]
        return self.to_torch()

    def sync_from_torch(self, tensor) -> None:
        """Adopt the shape a kernel gave ``tensor`` (made by ``torch_out``)."""
        if tensor.numel() and tensor.data_ptr() != self._torch_typed().data_ptr():
            raise CapacityError(f"kernel moved its output out of planned memory ({self!r})")
        self.resize(tuple(tensor.shape))

    def set_torch(self, tensor) -> None:
        """Copy a torch tensor of this dtype in, resizing to its shape."""
        self.resize(tuple(tensor.shape))
        self.to_torch().copy_(tensor)

    # -- mlx --------------------------------------------------------------

    def to_mx(self):
        """A new mlx array holding the current contents (bfloat16 stays bfloat16)."""
        import mlx.core as mx

        a = mx.array(self.array)
        return a.view(mx.bfloat16) if self.dtype is BFLOAT16 else a

    def set_mx(self, array) -> None:
        """Copy an mlx array of this dtype in, resizing to its shape."""
        import mlx.core as mx

        if self.dtype is BFLOAT16 and array.dtype == mx.bfloat16:
            array = array.view(mx.uint16)
        self.set(np.asarray(array))


def is_torch_tensor(x) -> bool:
    """True for torch tensors, without importing torch when nobody else has."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_mx_array(x) -> bool:
    """True for mlx arrays, without importing mlx when nobody else has."""
    mx = sys.modules.get("mlx.core")
    return mx is not None and isinstance(x, mx.array)
