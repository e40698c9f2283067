"""Giving back the pages of a memory-mapped file that a tensor was read from.

transformers loads a safetensors checkpoint of the dtype asked for as views of the file's
memory map (safetensors' ``mmap`` backend): nothing is copied, and a page is resident
only once read. Reading every weight once at export would still leave the whole file
resident (the process's RSS counts mapped file pages), so the export gives each tensor's
pages back when it is done with them. The file stays mapped and in the page cache: a
later read faults the page back in without touching the disk.
"""

import ctypes
import mmap
import sys

_MADV_DONTNEED = 4
SMALLEST = 2**20  # smaller tensors are not worth a look at the process's mappings
_libc = None


def release(tensor) -> bool:
    """Drops the whole pages of ``tensor`` (a contiguous one's bytes, else its storage's)
    from this process when they belong to a mapping of a file (never anonymous memory,
    whose contents would be lost); whether it did."""
    if not sys.platform.startswith("linux"):
        return False
    if tensor.is_contiguous():
        start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    else:
        storage = tensor.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (start + size) // mmap.PAGESIZE * mmap.PAGESIZE
    if size < SMALLEST or end <= first or not _in_file_mapping(start, start + size):
        return False
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return _libc.madvise(first, end - first, _MADV_DONTNEED) == 0


def _in_file_mapping(start: int, end: int) -> bool:
    """Whether ``[start, end)`` lies in one mapping of a file (``/proc/self/maps``: an
    inode other than 0 and a path)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            if low <= start < high:
                return end <= high and fields[4] != "0" and len(fields) == 6 and fields[5].startswith("/")
    return False
