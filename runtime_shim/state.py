"""State that lives as long as a loaded program and is shared by all its delegates.

mlx is imported where it is used: ``import etmlx`` imports this module before it loads
OpenBLAS, which must come before mlx (``runtime_shim/blas.py``)."""

import numpy as np

from .errors import InputError


class ProgramState:
    """Mutable buffers by name. A KV cache written by a ``prefill`` method's delegate is
    the one a ``decode`` method's delegate reads, because both name the same buffer;
    two loads of one file each get their own ``ProgramState``.

    A buffer declared to grow along an axis (a KV cache, IR ``grow_axis``) is held only
    as far along it as calls have needed: it starts empty there and ``reserve`` extends
    it with zeros, never past its declared shape.

    Also the constants every delegate loaded, so the weights that a prefill and a decode
    method share are held once."""

    def __init__(self):
        self._values: dict = {}
        self._declared: dict = {}  # name -> (shape, dtype, grow axis or None)
        self._constants: dict = {}

    def constant(self, identity, load):
        """The array for ``identity`` (key, dtype, shape), loaded by ``load()`` once."""
        if identity not in self._constants:
            self._constants[identity] = load()
        return self._constants[identity]

    def register(self, name: str, shape: tuple, dtype, load, grow_axis=None) -> None:
        """Declares buffer ``name``; the first delegate to declare it sets its value,
        ``load()``, or for a growing one an empty extent along ``grow_axis``."""
        import mlx.core as mx

        declared = (tuple(shape), dtype, grow_axis)
        if name not in self._values:
            if grow_axis is None:
                self._values[name] = load()
            else:
                self._values[name] = mx.zeros([0 if axis == grow_axis else n for axis, n in enumerate(shape)], dtype)
            self._declared[name] = declared
            return
        if self._declared[name] != declared:
            raise ValueError(f"buffer {name!r} is declared as {_describe(declared)} by one delegate "
                             f"and {_describe(self._declared[name])} by another")

    def reserve(self, name: str, extent: int) -> None:
        """Extends growing buffer ``name`` with zeros to ``extent`` along its axis; the
        copy this costs is one of the held part, once per window a conversation grows
        into."""
        import mlx.core as mx

        shape, _, axis = self._declared[name]
        if not 0 <= extent <= shape[axis]:
            raise InputError(f"buffer {name!r} asked to hold {extent} slots along axis {axis}; "
                             f"it has {shape[axis]}")
        value = self._values[name]
        held = value.shape[axis]
        if held < extent:
            pad = [extent - held if i == axis else n for i, n in enumerate(value.shape)]
            self._values[name] = mx.concatenate([value, mx.zeros(pad, value.dtype)], axis=axis)

    def snapshot(self) -> dict:
        """``{name: (dtype name, numpy array)}`` of every buffer as it is now (a growing
        one as far as it is held); bfloat16 as its 16-bit patterns."""
        import mlx.core as mx

        mx.eval(list(self._values.values()))
        arrays = {}
        for name, value in self._values.items():
            dtype = _dtype_name(value.dtype)
            arrays[name] = (dtype, np.array(value.view(mx.uint16) if dtype == "bfloat16" else value))
        return arrays

    def restore(self, arrays: dict) -> None:
        """Sets every buffer from ``arrays`` (``snapshot``'s form), which must name each
        declared buffer, in its dtype and shape (a growing one at most its capacity
        along its axis); raises InputError naming the first that does not fit, with no
        buffer changed."""
        import mlx.core as mx

        check_buffer_names(self._declared, arrays)
        values = {}
        for name, (dtype, array) in arrays.items():
            shape, declared_dtype, axis = self._declared[name]
            fits = [n == want or (i == axis and n <= want) for i, (n, want) in enumerate(zip(array.shape, shape))]
            if dtype != _dtype_name(declared_dtype) or len(array.shape) != len(shape) or not all(fits):
                raise InputError(f"saved buffer {name!r} is {dtype}{list(array.shape)}; this program's is "
                                 f"{_describe(self._declared[name])}")
            value = mx.array(array)
            values[name] = value.view(mx.bfloat16) if dtype == "bfloat16" else value
        self._values.update(values)

    def __getitem__(self, name: str):
        return self._values[name]

    def __setitem__(self, name: str, value) -> None:
        self._values[name] = value


def check_buffer_names(declared, arrays: dict) -> None:
    """InputError unless ``arrays`` name exactly the buffers ``declared``."""
    missing, unknown = sorted(set(declared) - set(arrays)), sorted(set(arrays) - set(declared))
    if missing or unknown:
        raise InputError(f"the saved state does not have this program's buffers: missing {missing or 'none'}, "
                         f"unknown {unknown or 'none'}")


def _describe(declared) -> str:
    shape, dtype, axis = declared
    grows = "" if axis is None else f" growing along axis {axis}"
    return f"{_dtype_name(dtype)}{list(shape)}{grows}"


def _dtype_name(dtype) -> str:
    """torch's name of an MLX dtype (``mx.float32`` -> ``"float32"``)."""
    return str(dtype).rsplit(".", 1)[-1]
