"""State that lives as long as a loaded program and is shared by all its delegates."""

import mlx.core as mx

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
        shape, _, axis = self._declared[name]
        if not 0 <= extent <= shape[axis]:
            raise InputError(f"buffer {name!r} asked to hold {extent} slots along axis {axis}; "
                             f"it has {shape[axis]}")
        value = self._values[name]
        held = value.shape[axis]
        if held < extent:
            pad = [extent - held if i == axis else n for i, n in enumerate(value.shape)]
            self._values[name] = mx.concatenate([value, mx.zeros(pad, value.dtype)], axis=axis)

    def __getitem__(self, name: str):
        return self._values[name]

    def __setitem__(self, name: str, value) -> None:
        self._values[name] = value


def _describe(declared) -> str:
    shape, dtype, axis = declared
    grows = "" if axis is None else f" growing along axis {axis}"
    return f"{dtype}{list(shape)}{grows}"
