"""Errors raised by the runtime shim. Each names the problem in its message."""


class PteFormatError(ValueError):
    """The bytes are not a well-formed ExecuTorch program this reader understands."""


class NoSuchMethodError(AttributeError):
    """A program was asked for a method it does not have."""


class InputError(ValueError):
    """Inputs given to a method do not match what its execution plan expects."""


class CapacityError(ValueError):
    """A tensor was asked to grow beyond the memory planned for it."""


class BackendError(RuntimeError):
    """No runtime backend is registered for a delegate's id."""


class ExecutionError(RuntimeError):
    """An instruction of an execution plan failed while running."""


class IndexRangeError(IndexError):
    """A run-time index (a token id, a cache position, ...) is out of range for the axis
    it indexes, as PyTorch would report with IndexError. The call changed no state."""


class OperatorError(RuntimeError):
    """A KernelCall names an operator this runtime cannot run."""
