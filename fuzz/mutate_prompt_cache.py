"""Mutations of a saved prompt (``etmlx.llm.prompt_cache``): random damage, and edits of its
JSON header's fields or of the buffers' bytes resealed with a valid checksum, so they
reach the reader's checks of each field and the runtimes' checks of each buffer."""

import json
import random
import struct
import zlib

from fuzz.mutate import INTERESTING, _file_bits, _file_truncate

PREFIX = struct.Struct("<8sIIQ")  # etmlx/llm/prompt_cache.py: magic, version, crc32, header bytes


def mutate(data: bytes, rng: random.Random) -> tuple:
    """(mutated bytes, what was done)."""
    kinds = [_file_bits, _file_truncate, _header_field, _header_field, _header_field, _body_bits]
    return rng.choice(kinds)(bytearray(data), rng)


def _parts(data) -> tuple:
    magic, version, _, length = PREFIX.unpack_from(data)
    return magic, version, json.loads(data[PREFIX.size:PREFIX.size + length]), bytes(data[PREFIX.size + length:])


def _sealed(magic, version, header, body: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    rest = struct.pack("<Q", len(encoded)) + encoded + body
    return struct.pack("<8sII", magic, version, zlib.crc32(rest)) + rest


def _header_field(data, rng):
    """One field of the header (or of one buffer's entry) set to another value."""
    magic, version, header, body = _parts(data)
    values = INTERESTING + [-1, -(2**63), "float16", "x", None, [], [0] * 5, {"a": 1}, 3.5]
    entry = rng.choice([header] + header["buffers"])
    field = rng.choice(sorted(entry))
    value = rng.choice(values)
    if field == "shape" and entry[field] and rng.random() < 0.5:
        axis = rng.randrange(len(entry[field]))
        entry[field][axis], what = value, f"shape[{axis}]"
    elif field == "tokens" and entry[field] and rng.random() < 0.5:
        entry[field][0], what = value, "tokens[0]"
    else:
        entry[field], what = value, field
    return _sealed(magic, version, header, body), f"saved prompt: {what} set to {value!r}"


def _body_bits(data, rng):
    """Bits of the buffers' bytes flipped: values any float can hold, so it runs."""
    magic, version, header, body = _parts(data)
    body = bytearray(body)
    flips = rng.randint(1, 8)
    for _ in range(flips):
        body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
    return _sealed(magic, version, header, bytes(body)), f"saved prompt: {flips} bits of its buffers flipped"
