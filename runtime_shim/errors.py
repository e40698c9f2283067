"""Errors raised by the runtime shim. Each names the problem in its message."""


class PteFormatError(ValueError):
    """The bytes are not a well-formed ExecuTorch program this reader understands."""


class InputError(ValueError):
    """Inputs given to a method do not match what its execution plan expects."""


class CapacityError(ValueError):
    """A tensor was asked to grow beyond the memory planned for it."""


class BackendError(RuntimeError):
    """No runtime backend is registered for a delegate's id."""


class ExecutionError(RuntimeError):
    """An instruction of an execution plan failed while running."""


class OperatorError(RuntimeError):
    """A KernelCall names an operator this runtime cannot run."""
