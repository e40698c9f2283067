"""The etmlx delegate payload: a fixed header followed by a ``Graph`` flatbuffer.

Header (little endian, 24 bytes)::

    magic          4s   b"EMLX"
    version        u32  FORMAT_VERSION of the writer
    body_size      u64  bytes of flatbuffer that follow
    body_crc32     u32  zlib.crc32 of those bytes
    reserved       u32  zero

The checksum turns any flipped bit into a clear error rather than a graph that
loads and computes something else; the structural checks in ``validate`` then
guard against payloads that are well-formed but inconsistent.
"""

import struct
import zlib

import flatbuffers

from .constants import FORMAT_VERSION, PAYLOAD_MAGIC as MAGIC
from .errors import PayloadError
from .generated.etmlx_ir import Graph as graph_module
from .validate import validate

_HEADER = struct.Struct("<4sIQII")
HEADER_SIZE = _HEADER.size


def serialize(graph: "graph_module.GraphT") -> bytes:
    """Returns header + flatbuffer for ``graph`` (an object-API ``GraphT``)."""
    validate(graph)  # a writer bug must fail at export, not on the user's device
    builder = flatbuffers.Builder(1024)
    # FlatBuffers leaves out a field equal to its default, and -0.0 == 0.0: a negative
    # zero (a Scalar, a pad value) would read back as +0.0, which x * -0.0 or
    # atan2(y, -0.0) tell apart. Every field is written.
    builder.ForceDefaults(True)
    builder.Finish(graph.Pack(builder))
    body = bytes(builder.Output())
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(body), zlib.crc32(body), 0) + body


def deserialize(data: bytes) -> "graph_module.GraphT":
    """Parses and validates a payload; raises ``PayloadError`` naming what is wrong."""
    data = bytes(data)
    if len(data) < HEADER_SIZE:
        raise PayloadError(f"payload truncated: {len(data)} bytes, header needs {HEADER_SIZE}")
    magic, version, body_size, crc, _ = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise PayloadError(f"not an etmlx payload: magic {magic!r}, expected {MAGIC!r}")
    if version > FORMAT_VERSION:
        raise PayloadError(
            f"payload format version {version} is newer than this etmlx reads "
            f"({FORMAT_VERSION}); upgrade etmlx or re-export the model"
        )
    body = data[HEADER_SIZE:]
    if len(body) < body_size:
        raise PayloadError(f"payload truncated: header promises {body_size} bytes, {len(body)} present")
    body = body[:body_size]
    if not body:
        raise PayloadError("payload empty: the header promises no graph")
    if zlib.crc32(body) != crc:
        raise PayloadError("payload corrupted: checksum mismatch")
    try:
        graph = graph_module.GraphT.InitFromPackedBuf(body, 0)
    except Exception as error:  # flatbuffers raises whatever struct/indexing hits first
        raise PayloadError(f"payload unreadable: {type(error).__name__}: {error}") from error
    _plain_python_values(graph)
    validate(graph)
    return graph


def _plain_python_values(graph) -> None:
    """The object API unpacks scalar vectors as numpy arrays (when numpy is installed)
    and strings as bytes; lists and str keep every consumer simple."""
    tables = [node.op for node in graph.nodes or [] if node.op is not None] + list(graph.constants or [])
    tables += list(graph.buffers or [])
    tables += [buffer.initial for buffer in graph.buffers or [] if buffer.initial is not None]
    for table in tables:
        for name, value in vars(table).items():
            if hasattr(value, "tolist"):
                setattr(table, name, value.tolist())
            elif isinstance(value, bytes):
                try:
                    setattr(table, name, value.decode("utf-8"))
                except UnicodeDecodeError as error:
                    raise PayloadError(f"payload unreadable: {name} is not UTF-8") from error
