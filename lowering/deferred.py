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

A checkpoint loaded in another dtype than its own is such a placeholder too
(``converted``): the mapped tensor in the wanted dtype, whose values a quantizer reads a
block of rows at a time (``rows``) and lowering whole, so that the model is never whole in
memory in the wider dtype.

What a placeholder's values become in the program (a quantized weight's packed words) may
come from elsewhere, a second process that computed them from the checkpoint while this
one traced the model (``etmlx/quant/pack_worker.py``): it is ``offer``ed in a named form,
and lowering takes it through ``prepared``, which computes it here where it did not come.
"""

import contextlib

import torch

from .mapped_pages import release

_scopes = []  # the open scopes' entries: {(address, shape, dtype): (placeholder, compute, source or None)}
_forms = []  # and their offered forms: {(identity, form): (tensor, get)}


@contextlib.contextmanager
def scope():
    """Placeholders made inside the block resolve inside it."""
    entries, forms = {}, {}
    _scopes.append(entries)
    _forms.append(forms)
    try:
        yield
    finally:
        _scopes.remove(entries)
        _forms.remove(forms)
        entries.clear()
        forms.clear()


def placeholder(shape, dtype, compute) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` whose value is ``compute()``, called each time
    lowering reads it; its own memory is never written."""
    return _entered(torch.empty(shape, dtype=dtype), compute, None)


def converted(source, dtype) -> torch.Tensor:
    """``source.to(dtype)`` as a placeholder: computed when read, the pages of a mapped
    ``source`` given back after."""

    def compute():
        value = source.to(dtype, copy=True)
        release(source)
        return value

    return _entered(torch.empty(source.shape, dtype=dtype), compute, source)


@contextlib.contextmanager
def rows(tensor, block: slice):
    """``tensor[block]``'s values (a ``converted`` placeholder's read from its source, no
    other placeholder's: those are whole values); the pages of a mapped tensor read are
    given back after the block."""
    entry = _entry(tensor)
    if entry is not None and entry[2] is None:
        raise RuntimeError("rows of a deferred constant are read whole, through resolve()")
    source = tensor if entry is None else entry[2]
    try:
        yield source[block].to(tensor.dtype)
    finally:
        release(source[block])


def source(tensor):
    """The tensor ``rows`` reads ``tensor``'s values from: a ``converted`` placeholder's
    source, else ``tensor`` itself."""
    entry = _entry(tensor)
    return tensor if entry is None or entry[2] is None else entry[2]


def offer(tensor, form, get) -> None:
    """Says that ``get()`` gives what ``tensor``'s values become in ``form`` (a key that
    names the function that makes it), computed elsewhere, or None where it could not be:
    ``prepared`` returns it then."""
    if not _scopes:
        raise RuntimeError("deferred constants are made inside deferred.scope()")
    _forms[-1][_identity(tensor), form] = tensor, get  # the tensor held: its address names no other


def prepared(tensor, form, make):
    """``make(values of tensor)``: what was ``offer``ed for ``tensor`` in ``form`` where it
    came, else computed now."""
    key = _identity(tensor), form
    offered = next((forms[key][1] for forms in reversed(_forms) if key in forms), None)
    value = None if offered is None else offered()
    return make(resolve(tensor)) if value is None else value


def _entered(tensor, compute, source) -> torch.Tensor:
    if not _scopes:
        raise RuntimeError("deferred constants are made inside deferred.scope()")
    _scopes[-1][_key(tensor)] = (tensor, compute, source)
    return tensor


def resolve(tensor):
    """``tensor``'s value: computed now when it is a placeholder (or a parameter over
    one's storage), else ``tensor`` itself."""
    entry = _entry(tensor)
    return tensor if entry is None else entry[1]()


def _entry(tensor):
    """(placeholder, compute, source) of ``tensor``'s storage in an open scope, else None."""
    key = _identity(tensor) if _scopes else None
    return None if key is None else next((entries[key] for entries in reversed(_scopes) if key in entries), None)


def _identity(tensor):
    """What names ``tensor``'s values while it is alive: its storage's address, shape and
    dtype (a parameter over a placeholder's storage is named as the placeholder); None
    for a tensor without storage (fake, a wrapper subclass) or no tensor."""
    if not isinstance(tensor, torch.Tensor):
        return None
    try:
        return _key(tensor)
    except (RuntimeError, NotImplementedError):
        return None


def _key(tensor) -> tuple:
    return tensor.data_ptr(), tuple(tensor.shape), tensor.dtype, tensor.untyped_storage().nbytes()
