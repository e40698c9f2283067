"""Read the container of a ``.pte`` file: identifier, extended header, segments.

Layout written by ExecuTorch 1.5.1 (``exir/_serialize/_program.py``)::

    [0:4]   root table offset of the Program flatbuffer
    [4:8]   file identifier "ET12"
    [8:40]  optional extended header "eh00": header length (u32), program size
            (u64), segment base offset (u64), segment data size (u64), all little
            endian; only present when the file has segments
    ...     rest of the flatbuffer
    [segment base offset:]  segments (constants, delegate payloads, named data),
            each at Program.segments[i].offset from the segment base
"""

import hashlib
import mmap
import os
from dataclasses import dataclass

import numpy as np

from . import pte_types as t
from .decode import decode_program
from .errors import PteFormatError

FILE_IDENTIFIER = b"ET12"
_HEADER_MAGIC = b"eh00"
_HEADER_MIN_LENGTH = 24  # magic, length, program size, segment base offset


@dataclass(frozen=True)
class ExtendedHeader:
    program_size: int
    segment_base_offset: int
    segment_data_size: int  # 0 when the writer did not fill it in


def _file_contents(path_or_bytes):
    """The file contents as a writable buffer: a path is mapped, not read.

    Mapped copy-on-write (``ACCESS_COPY``): the bytes are read from the file as they
    are touched, so a backend that copies its weights out holds them once, and pages
    it is done with can be dropped (``NamedDataLookup.evict``). Writable because
    planned tensors and constants are handed to torch kernels as tensors sharing this
    memory, and torch rejects read-only numpy memory; a write stays in this process.
    As with ExecuTorch's ``MmapDataLoader``, the file must not be truncated while a
    program loaded from it lives (``etmlx.export`` replaces a file, never rewrites it).
    """
    if isinstance(path_or_bytes, (str, os.PathLike)):
        with open(path_or_bytes, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return bytearray()  # mmap refuses an empty file; the reader names it truncated
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    if isinstance(path_or_bytes, bytearray):
        return path_or_bytes
    return bytearray(path_or_bytes)


def _extended_header(data: bytearray) -> ExtendedHeader | None:
    if data[8:12] != _HEADER_MAGIC:
        return None
    if len(data) < 8 + _HEADER_MIN_LENGTH:
        raise PteFormatError(f"truncated file: {len(data)} bytes end inside the extended header")
    length = int.from_bytes(data[12:16], "little")
    if length < _HEADER_MIN_LENGTH:
        raise PteFormatError(f"extended header length {length} < {_HEADER_MIN_LENGTH}")
    field = lambda at: int.from_bytes(data[8 + at : 8 + at + 8], "little")  # noqa: E731
    return ExtendedHeader(
        program_size=field(8),
        segment_base_offset=field(16),
        segment_data_size=field(24) if length >= _HEADER_MIN_LENGTH + 8 else 0,
    )


class NamedDataLookup:
    """Named blobs of a program (``Program.named_data``), as handed to backends."""

    def __init__(self, pte: "PteFile"):
        self._pte = pte

    def keys(self) -> list[str]:
        return list(self._pte.program.named_data)

    def __contains__(self, key: str) -> bool:
        return key in self._pte.program.named_data

    def get(self, key: str) -> memoryview:
        """The bytes stored under ``key``; a PteFormatError (the program names data it
        does not hold) if absent."""
        return memoryview(self._pte.segment(self._index(key)))

    def evict(self, key: str) -> None:
        """Drops the pages of ``key``'s bytes from this process's memory, for a backend
        that has copied them: read from the file again if asked for again. Nothing
        happens when the program was given as bytes."""
        self._pte.evict_segment(self._index(key))

    def _index(self, key: str) -> int:
        try:
            return self._pte.program.named_data[key]
        except KeyError:
            raise PteFormatError(f"no named data {key!r} in this program ({len(self.keys())} keys)") from None


class PteFile:
    """A parsed ``.pte``: the decoded program plus access to the bytes it points at."""

    def __init__(self, data):
        """``data``: the file's bytes, a bytearray or an ``mmap``."""
        if len(data) < 8:
            raise PteFormatError(f"truncated file: {len(data)} bytes is too short to be a .pte")
        ident = bytes(data[4:8])
        if ident != FILE_IDENTIFIER:
            if ident[:2] == b"ET" and ident[2:].isalnum():
                raise PteFormatError(
                    f"unsupported .pte schema version {ident.decode()!r}; this reader understands {FILE_IDENTIFIER.decode()!r}"
                )
            raise PteFormatError(f"not an ExecuTorch .pte file: file identifier is {ident!r}, expected {FILE_IDENTIFIER!r}")
        self.data = data
        self.header = _extended_header(data)
        if self.header is not None:
            needed = max(self.header.program_size, self.header.segment_base_offset + self.header.segment_data_size)
            if needed > len(data):
                raise PteFormatError(f"truncated file: header says {needed} bytes, file has {len(data)}")
        self.program: t.Program = decode_program(data)
        for key, index in self.program.named_data.items():
            self._check_segment_index(index, f"named data {key!r}")

    @property
    def named_data(self) -> NamedDataLookup:
        """Made on each access rather than stored: a stored lookup would form a reference
        cycle with this file, keeping the whole file's bytes alive until a gc pass."""
        return NamedDataLookup(self)

    def _check_segment_index(self, index: int, what: str) -> None:
        if not 0 <= index < len(self.program.segments):
            raise PteFormatError(f"{what} refers to segment {index}, but the file has {len(self.program.segments)}")

    def segment(self, index: int) -> np.ndarray:
        """Segment ``index`` as a uint8 view into the file bytes."""
        self._check_segment_index(index, "a reference")
        if self.header is None:
            raise PteFormatError(f"segment {index} is referenced but the file has no extended header")
        seg = self.program.segments[index]
        start = self.header.segment_base_offset + seg.offset
        if start + seg.size > len(self.data):
            raise PteFormatError(
                f"segment {index} (bytes {start}..{start + seg.size}) is out of range of the {len(self.data)}-byte file"
            )
        return np.frombuffer(self.data, np.uint8, seg.size, start)

    def evict_segment(self, index: int) -> None:
        """Drops the whole pages inside segment ``index`` from memory when the file is
        mapped. Pages it shares with a neighbour stay: that one may have been written."""
        if not isinstance(self.data, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return
        view = self.segment(index)
        start = self.header.segment_base_offset + self.program.segments[index].offset
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (start + len(view)) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > first:
            self.data.madvise(mmap.MADV_DONTNEED, first, end - first)

    def constant(self, data_buffer_idx: int, nbytes: int) -> np.ndarray:
        """The serialized data of constant tensor ``data_buffer_idx`` (``nbytes`` long)."""
        if self.program.constant_buffer:
            buffers = self.program.constant_buffer
            if not 0 < data_buffer_idx < len(buffers):
                raise PteFormatError(f"constant buffer {data_buffer_idx} out of range (have {len(buffers)})")
            return _sized(buffers[data_buffer_idx], nbytes, f"constant buffer {data_buffer_idx}")
        if self.program.constant_segment is None:
            raise PteFormatError(f"constant {data_buffer_idx} is referenced but the file has no constant data")
        return self._subsegment(self.program.constant_segment, data_buffer_idx, nbytes, "constant")

    def mutable_initial(self, segments_idx: int, data_buffer_idx: int, nbytes: int) -> np.ndarray:
        """Serialized initial value of a mutable (memory-planned) tensor."""
        table = self.program.mutable_data_segments
        if not 0 <= segments_idx < len(table):
            raise PteFormatError(f"mutable data segment list {segments_idx} out of range (have {len(table)})")
        return self._subsegment(table[segments_idx], data_buffer_idx, nbytes, "mutable tensor")

    def _subsegment(self, sub: t.SubsegmentOffsets, idx: int, nbytes: int, what: str) -> np.ndarray:
        if not 0 <= idx < len(sub.offsets):
            raise PteFormatError(f"{what} data index {idx} out of range (have {len(sub.offsets)})")
        seg = self.segment(sub.segment_index)
        start = sub.offsets[idx]
        return _sized(seg[start:], nbytes, f"{what} data {idx}")

    def delegate_data(self, delegate: t.BackendDelegate) -> memoryview:
        """The processed payload of a delegate, inline or in a segment."""
        if delegate.location == t.INLINE:
            blobs = self.program.backend_delegate_data
            if not 0 <= delegate.index < len(blobs):
                raise PteFormatError(f"delegate {delegate.id!r} refers to inline data {delegate.index} of {len(blobs)}")
            return memoryview(blobs[delegate.index])
        if delegate.location == t.SEGMENT:
            return memoryview(self.segment(delegate.index))
        raise PteFormatError(f"delegate {delegate.id!r} has unknown data location {delegate.location}")


def _sized(view: np.ndarray, nbytes: int, what: str) -> np.ndarray:
    if len(view) < nbytes:
        raise PteFormatError(f"{what} needs {nbytes} bytes but only {len(view)} are stored")
    return view[:nbytes]


def program_identity(pte: PteFile, backend_id: str) -> str:
    """A digest of the program's ``backend_id`` payloads, method by method: their graphs
    and the keys of their weights (which hash the weights' bytes). Two exports of one
    model with other options (context, quantization) differ; a re-export of the same
    does not. What a saved KV cache (``etmlx.llm.prompt_cache``) is matched against."""
    digest = hashlib.sha256()
    for plan in pte.program.plans:
        for delegate in plan.delegates:
            if delegate.id == backend_id:
                payload = pte.delegate_data(delegate)
                digest.update(plan.name.encode() + b"\0" + len(payload).to_bytes(8, "little") + payload)
    return digest.hexdigest()


def read_pte(path_or_bytes) -> PteFile:
    """Parse a ``.pte`` from a path or its bytes; raises ``PteFormatError`` when malformed."""
    return PteFile(_file_contents(path_or_bytes))
