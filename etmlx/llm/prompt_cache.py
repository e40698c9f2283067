"""Saved prompts: a loaded language model's KV cache after a prefill (a system prompt, a
document, a conversation), in a file, restored into a fresh load of the same ``.pte`` on
either runtime, so those tokens are not prefilled again.

The file holds the program's buffers as far as they are held (a growing cache: only
its filled windows), the token ids they hold, and what the caller adds (``etmlx chat``:
the conversation's messages); it names the program it came from (``identity``: a digest
of its etmlx payloads, which name its weights by their hash), and a file from another
model or export is refused by name. Layout, little-endian::

    magic "ETMLXKV\\0" | u32 version | u32 CRC32 of all that follows | u64 header bytes
    header: JSON {"program", "tokens", "extra", "buffers": [{"name", "dtype", "shape",
            "offset", "nbytes"}]} | the buffers' bytes, at their offsets
"""

import json
import math
import os
import struct
import zlib

import numpy as np

from etmlx.errors import EtMlxError
from etmlx.serializer.ir import NUMPY_STORAGE, TORCH_DTYPE_NAMES

MAGIC = b"ETMLXKV\0"
VERSION = 1
_PREFIX = struct.Struct("<8sIIQ")
_STORAGE = {name: NUMPY_STORAGE[dtype] for dtype, name in TORCH_DTYPE_NAMES.items()}


class PromptCacheError(EtMlxError, ValueError):
    """A saved prompt that is damaged, of another format, or of another program."""


def save(program, path, tokens: list, extra=None) -> None:
    """Writes ``program``'s KV cache, which holds ``tokens`` (from position 0), to
    ``path`` (beside it, then renamed into place)."""
    arrays, entries, offset = _state(program).read_state(), [], 0
    for name, (dtype, array) in arrays.items():
        entries.append({"name": name, "dtype": dtype, "shape": list(array.shape), "offset": offset,
                        "nbytes": array.nbytes})
        offset += array.nbytes
    header = json.dumps({"program": program.identity, "tokens": [int(t) for t in tokens], "extra": extra,
                         "buffers": entries}).encode()
    crc = zlib.crc32(struct.pack("<Q", len(header)) + header)
    for _, array in arrays.values():
        crc = zlib.crc32(np.require(array, requirements="C").data, crc)
    temporary = f"{os.fspath(path)}.partial"
    with open(temporary, "wb") as f:
        f.write(_PREFIX.pack(MAGIC, VERSION, crc, len(header)) + header)
        for _, array in arrays.values():
            f.write(np.require(array, requirements="C").data)
    os.replace(temporary, path)


def restore(program, path) -> tuple:
    """Sets ``program``'s KV cache from the file ``save`` wrote; returns (the tokens it
    holds, the caller's ``extra``). Raises PromptCacheError naming what is wrong, the
    state unchanged."""
    from etmlx.runtime_shim.errors import InputError

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise PromptCacheError(f"cannot read the saved prompt {path}: {error.strerror}") from None
    header, body = _parse(data, path)
    if header["program"] != program.identity:
        raise PromptCacheError(f"{path} was saved from another program (another model, or another export of it): "
                               "save it again from this .pte")
    arrays = {}
    for entry in header["buffers"]:
        arrays[entry["name"]] = (entry["dtype"], _array(entry, body, path))
    try:
        _state(program).write_state(arrays)
    except InputError as error:
        raise PromptCacheError(f"{path}: {error}") from None
    return header["tokens"], header["extra"]


def _state(program):
    if not hasattr(program, "read_state"):
        raise PromptCacheError(f"a {type(program).__name__} cannot save or restore its KV cache")
    return program


def _parse(data: bytes, path) -> tuple:
    """(header, the bytes after it), every field checked."""
    if len(data) < _PREFIX.size or data[:8] != MAGIC:
        raise PromptCacheError(f"{path} is not a saved prompt (no {MAGIC[:7].decode()} header)")
    _, version, crc, length = _PREFIX.unpack_from(data)
    if version != VERSION:
        raise PromptCacheError(f"{path} is a saved prompt of format {version}; this etmlx reads {VERSION}")
    if zlib.crc32(data[16:]) != crc:
        raise PromptCacheError(f"{path} is damaged (its checksum does not match)")
    if length > len(data) - _PREFIX.size:
        raise PromptCacheError(f"{path} is truncated: a header of {length} bytes does not fit")
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + length])
    except ValueError:
        raise PromptCacheError(f"{path}: its header is not JSON") from None
    fields = {"program": str, "tokens": list, "buffers": list}
    if not isinstance(header, dict) or any(not isinstance(header.get(k), t) for k, t in fields.items()):
        raise PromptCacheError(f"{path}: its header lacks the program, tokens or buffers")
    if not all(isinstance(t, int) and t >= 0 for t in header["tokens"]):
        raise PromptCacheError(f"{path}: its tokens are not token ids")
    header.setdefault("extra", None)
    return header, data[_PREFIX.size + length:]


def _array(entry, body: bytes, path) -> np.ndarray:
    """A buffer's array, its entry checked against the bytes there are."""
    known_dtype = isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and entry["dtype"] in _STORAGE
    if not known_dtype or not isinstance(entry.get("name"), str):
        raise PromptCacheError(f"{path}: a buffer entry without a name or a known dtype")
    shape, offset, nbytes = entry.get("shape"), entry.get("offset"), entry.get("nbytes")
    if not isinstance(shape, list) or not all(isinstance(n, int) and 0 <= n < 2**31 for n in shape):
        raise PromptCacheError(f"{path}: buffer {entry['name']!r} has no valid shape")
    storage = _STORAGE[entry["dtype"]]
    if not (isinstance(offset, int) and isinstance(nbytes, int) and 0 <= offset <= offset + nbytes <= len(body)):
        raise PromptCacheError(f"{path}: buffer {entry['name']!r} lies outside the file")
    if nbytes != math.prod(shape) * storage.itemsize:
        raise PromptCacheError(f"{path}: buffer {entry['name']!r} has {nbytes} bytes; its shape needs "
                               f"{math.prod(shape) * storage.itemsize}")
    return np.frombuffer(body, storage, math.prod(shape), offset).reshape(shape)
