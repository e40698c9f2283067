"""State that lives as long as a loaded program and is shared by all its delegates."""


class ProgramState:
    """Mutable buffers by name. A KV cache written by a ``prefill`` method's delegate is
    the one a ``decode`` method's delegate reads, because both name the same buffer;
    two loads of one file each get their own ``ProgramState``.

    Also the constants every delegate loaded, so the weights that a prefill and a decode
    method share are held once."""

    def __init__(self):
        self._values: dict = {}
        self._constants: dict = {}

    def constant(self, identity, load):
        """The array for ``identity`` (key, dtype, shape), loaded by ``load()`` once."""
        if identity not in self._constants:
            self._constants[identity] = load()
        return self._constants[identity]

    def register(self, name: str, initial) -> None:
        """Declares buffer ``name``; the first delegate to declare it sets its value."""
        if name not in self._values:
            self._values[name] = initial
            return
        current = self._values[name]
        if (current.shape, current.dtype) != (initial.shape, initial.dtype):
            raise ValueError(
                f"buffer {name!r} is declared as {initial.dtype}{list(initial.shape)} by one delegate "
                f"and {current.dtype}{list(current.shape)} by another"
            )

    def __getitem__(self, name: str):
        return self._values[name]

    def __setitem__(self, name: str, value) -> None:
        self._values[name] = value
