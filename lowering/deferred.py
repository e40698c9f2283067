"""Constants computed when lowering reads them, not when the model is prepared.

Quantizing a whole language model before tracing holds every weight's integer values
(one byte each, twice the packed size) until they are packed: 8 GB for an 8B model.
Tracing and the edge passes never read a constant's values, only its shape and dtype,
so a quantizer may give a weight's parts a placeholder instead (``placeholder``): memory
that is allocated but never written, which the operating system backs with no pages. The
lowering context reads every constant through ``resolve``, which computes a placeholder's
value then, for the one weight being packed, and drops it once packed.

Placeholders are found by their storage's address, which the edge passes keep (they
unwrap tensor subclasses into parameters over the same storage). They exist only inside
``scope()``, which holds each one alive, so that no other tensor can be given its
address while its entry stands, and forgets them all at its end.
"""

import contextlib

import torch

_scopes = []  # the open scopes' entries: {(address, shape, dtype): (placeholder, compute)}


@contextlib.contextmanager
def scope():
    """Placeholders made inside the block resolve inside it."""
    entries = {}
    _scopes.append(entries)
    try:
        yield
    finally:
        _scopes.remove(entries)
        entries.clear()


def placeholder(shape, dtype, compute) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` whose value is ``compute()``, called each time
    lowering reads it; its own memory is never written."""
    if not _scopes:
        raise RuntimeError("deferred constants are made inside deferred.scope()")
    tensor = torch.empty(shape, dtype=dtype)
    _scopes[-1][_key(tensor)] = (tensor, compute)
    return tensor


def resolve(tensor):
    """``tensor``'s value: computed now when it is a placeholder (or a parameter over
    one's storage), else ``tensor`` itself."""
    if not _scopes or not isinstance(tensor, torch.Tensor):
        return tensor
    try:
        key = _key(tensor)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (fake, a wrapper subclass)
        return tensor
    for entries in reversed(_scopes):
        if key in entries:
            return entries[key][1]()
    return tensor


def _key(tensor) -> tuple:
    return tensor.data_ptr(), tuple(tensor.shape), tensor.dtype, tensor.untyped_storage().nbytes()
