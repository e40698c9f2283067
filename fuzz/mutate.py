"""Mutations of a .pte: random damage anywhere in the file, and structured edits of the
etmlx payloads inside it (header fields, table fields, vector lengths, union types)
resealed with a valid checksum, so they reach the readers' structural checks."""

import random
import struct
import zlib

from etmlx.serializer.generated.etmlx_ir import Graph

HEADER = struct.Struct("<4sIQII")  # serializer/payload.py: magic, version, body size, crc32, reserved
# Values that break assumptions: zero, one, all ones, sign bits, near limits.
INTERESTING = [0, 1, 2, 3, 7, 8, 16, 255, 256, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 24, 1 << 31]


def payloads(data: bytes) -> list:
    """(start, body size) of every etmlx payload in a .pte."""
    found, at = [], data.find(b"EMLX")
    while at != -1:
        if at + HEADER.size <= len(data):
            _, _, size, _, _ = HEADER.unpack_from(data, at)
            if at + HEADER.size + size <= len(data):
                found.append((at, size))
        at = data.find(b"EMLX", at + 1)
    return found


def mutate(data: bytes, rng: random.Random) -> tuple:
    """(mutated bytes, what was done)."""
    kinds = [_file_bits, _file_truncate, _file_words]
    if payloads(data):
        kinds += [_payload_bits, _payload_field, _payload_field, _payload_vector_length, _payload_union_type,
                  _payload_header, _payload_truncate]
    return rng.choice(kinds)(bytearray(data), rng)


def _write(buffer: bytearray, position: int, width: int, value: int) -> None:
    width = min(width, len(buffer) - position)
    buffer[position : position + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")


def _file_bits(data, rng):
    flips = rng.randint(1, 8)
    for _ in range(flips):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data), f"file: {flips} bits flipped"


def _file_truncate(data, rng):
    keep = rng.randrange(len(data))
    return bytes(data[:keep]), f"file: truncated to {keep} of {len(data)} bytes"


def _file_words(data, rng):
    """Interesting values over aligned words of the ExecuTorch program (before the
    segments): sizes, indices, offsets of its tables."""
    end = min(len(data), payloads(data)[0][0] if payloads(data) else len(data))
    position = rng.randrange(0, max(4, end - 4), 4)
    value = rng.choice(INTERESTING)
    _write(data, position, 4, value)
    return bytes(data), f"file: word at {position} set to {value:#x}"


def _body(data, rng):
    start, size = rng.choice(payloads(data))
    body_start = start + HEADER.size
    return start, body_start, bytearray(data[body_start : body_start + size])


def _reseal(data, start, body_start, body) -> bytes:
    """Writes ``body`` back (same length) and makes the payload's checksum valid again."""
    data[body_start : body_start + len(body)] = body
    magic, version, size, _, reserved = HEADER.unpack_from(data, start)
    HEADER.pack_into(data, start, magic, version, size, zlib.crc32(bytes(body)), reserved)
    return bytes(data)


def _payload_bits(data, rng):
    start, body_start, body = _body(data, rng)
    flips = rng.randint(1, 4)
    for _ in range(flips):
        body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
    return _reseal(data, start, body_start, body), f"payload at {start}: {flips} bits flipped, resealed"


def _tables(body: bytearray) -> list:
    """Positions of the payload's tables: the graph, its values, constants, buffers,
    nodes and each node's op table."""
    graph = Graph.Graph.GetRootAs(bytes(body), 0)
    tables = [graph._tab.Pos]
    for count, get in ((graph.InputsLength(), graph.Inputs), (graph.OutputsLength(), graph.Outputs),
                       (graph.ConstantsLength(), graph.Constants)):
        tables += [get(i)._tab.Pos for i in range(count)]
    for i in range(graph.BuffersLength()):
        buffer = graph.Buffers(i)
        tables.append(buffer._tab.Pos)
        if buffer.Initial() is not None:
            tables.append(buffer.Initial()._tab.Pos)
    for i in range(graph.NodesLength()):
        node = graph.Nodes(i)
        tables.append(node._tab.Pos)
        if node.Op() is not None:
            tables.append(node.Op().Pos)
    return tables


def _fields(body: bytearray, table: int) -> list:
    """(position, width) of each field a table stores, from its vtable."""
    vtable = table - struct.unpack_from("<i", body, table)[0]
    vtable_size, table_size = struct.unpack_from("<HH", body, vtable)
    offsets = sorted(o for o in struct.unpack_from(f"<{(vtable_size - 4) // 2}H", body, vtable + 4) if o)
    ends = offsets[1:] + [table_size]
    return [(table + o, max(1, min(8, end - o))) for o, end in zip(offsets, ends)]


def _payload_field(data, rng):
    start, body_start, body = _body(data, rng)
    fields = [f for table in _tables(body) for f in _fields(body, table)]
    position, width = rng.choice(fields)
    width = rng.choice([w for w in (1, 2, 4, 8) if w <= width] or [1])
    value = rng.choice(INTERESTING + [rng.getrandbits(8 * width)])
    _write(body, position, width, value)
    return _reseal(data, start, body_start, body), f"payload at {start}: {width}-byte field at {position} set to {value:#x}"


def _payload_vector_length(data, rng):
    """A field read as an offset to a vector: its length prefix set to an interesting value."""
    start, body_start, body = _body(data, rng)
    candidates = []
    for table in _tables(body):
        for position, width in _fields(body, table):
            if width >= 4:
                target = position + struct.unpack_from("<I", body, position)[0]
                if position < target <= len(body) - 4 and struct.unpack_from("<I", body, target)[0] < 1 << 16:
                    candidates.append(target)
    if not candidates:
        return _payload_bits(data, rng)
    target, value = rng.choice(candidates), rng.choice(INTERESTING)
    _write(body, target, 4, value)
    return _reseal(data, start, body_start, body), f"payload at {start}: vector length at {target} set to {value:#x}"


def _payload_union_type(data, rng):
    start, body_start, body = _body(data, rng)
    graph = Graph.Graph.GetRootAs(bytes(body), 0)
    if not graph.NodesLength():
        return _payload_bits(data, rng)
    node = graph.Nodes(rng.randrange(graph.NodesLength()))
    offset = node._tab.Offset(4)  # Node.op_type
    value = rng.choice([0, rng.randrange(1, 64), 255])
    if offset:
        body[node._tab.Pos + offset] = value
    return _reseal(data, start, body_start, body), f"payload at {start}: a node's op type set to {value}"


def _payload_header(data, rng):
    start, _ = rng.choice(payloads(data))
    field, position, width = rng.choice([("magic", 0, 4), ("version", 4, 4), ("body size", 8, 8), ("crc", 16, 4)])
    value = rng.choice(INTERESTING)
    _write(data, start + position, width, value)
    return bytes(data), f"payload at {start}: header {field} set to {value:#x}"


def _payload_truncate(data, rng):
    """The header promises fewer bytes than the flatbuffer needs (resealed)."""
    start, body_start, body = _body(data, rng)
    keep = rng.randrange(len(body))
    magic, version, _, _, reserved = HEADER.unpack_from(data, start)
    HEADER.pack_into(data, start, magic, version, keep, zlib.crc32(bytes(body[:keep])), reserved)
    return bytes(data), f"payload at {start}: body cut to {keep} of {len(body)} bytes, resealed"
