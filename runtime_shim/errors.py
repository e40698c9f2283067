"""Errors raised by the runtime shim. Each names the problem in its message, and each is
an ``EtMlxError`` as well as the built-in error a Python caller would expect."""

from etmlx.errors import EtMlxError


class PteFormatError(EtMlxError, ValueError):
    """The bytes are not a well-formed ExecuTorch program this reader understands."""


class NoSuchMethodError(EtMlxError, AttributeError):
    """A program was asked for a method it does not have."""


class InputError(EtMlxError, ValueError):
    """Inputs given to a method do not match what its execution plan expects."""


class CapacityError(EtMlxError, ValueError):
    """A tensor was asked to grow beyond the memory planned for it."""


class BackendError(EtMlxError, RuntimeError):
    """No runtime backend is registered for a delegate's id."""


class ExecutionError(EtMlxError, RuntimeError):
    """An instruction of an execution plan failed while running."""


class IndexRangeError(EtMlxError, IndexError):
    """A run-time index (a token id, a cache position, ...) is out of range for the axis
    it indexes, as PyTorch would report with IndexError. The call changed no state."""


class OperatorError(EtMlxError, RuntimeError):
    """A KernelCall names an operator this runtime cannot run."""
