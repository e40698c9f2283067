"""Giving back the pages of a memory-mapped file that a tensor was read from.

transformers loads a safetensors checkpoint of the dtype asked for as views of the file's
memory map (safetensors' ``mmap`` backend): nothing is copied, and a page is resident
only once read. Reading every weight once at export would still leave the whole file
resident (the process's RSS counts mapped file pages), so the export gives each tensor's
pages back when it is done with them. The file stays mapped: a later read faults a page
back in, from the page cache or the disk.
"""

import ctypes
import mmap
import sys

import numpy as np

_MADV_DONTNEED = 4
_MADV_PAGEOUT = 21  # Linux 5.4 and later; an older kernel refuses it, and the pages stay
SMALLEST = 2**20  # smaller tensors are not worth a look at the process's mappings
_libc = None


def release(tensor) -> bool:
    """Gives back the whole pages of ``tensor`` (a contiguous one's bytes, else a torch
    tensor's storage's; a numpy array's only when contiguous) when they belong to a
    mapping of a file, never anonymous memory; whether it did. A private writable
    mapping (safetensors maps its files so) may hold pages a write made this process's
    own, which dropping would turn back into the file's bytes: a range holding any is
    paged out instead (``MADV_PAGEOUT``, which keeps every byte, but may evict the file's
    pages from the page cache too)."""
    if not sys.platform.startswith("linux"):
        return False
    start, size = _extent(tensor)
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (start + size) // mmap.PAGESIZE * mmap.PAGESIZE
    if size < SMALLEST or end <= first:
        return False
    permissions = _file_mapping(start, start + size)
    if permissions is None:
        return False
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    private_writable = "w" in permissions and permissions.endswith("p")
    unsafe_to_drop = private_writable and not _only_file_pages(first, end)
    return _libc.madvise(first, end - first, _MADV_PAGEOUT if unsafe_to_drop else _MADV_DONTNEED) == 0


def _extent(tensor) -> tuple:
    """(first address, size in bytes) of what ``tensor`` reads."""
    if isinstance(tensor, np.ndarray):  # a contiguous array's bytes; none of another
        return tensor.ctypes.data, tensor.nbytes if tensor.flags.c_contiguous else 0
    if tensor.is_contiguous():
        return tensor.data_ptr(), tensor.numel() * tensor.element_size()
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _only_file_pages(first: int, end: int) -> bool:
    """Whether every resident page of ``[first, end)`` is still the file's (none made
    private by a write), from ``/proc/self/pagemap``: bit 63 present, bit 61 a file page.
    False where it cannot be read."""
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(first // mmap.PAGESIZE * 8)
            entries = pagemap.read((end - first) // mmap.PAGESIZE * 8)
    except OSError:
        return False
    if len(entries) != (end - first) // mmap.PAGESIZE * 8:
        return False
    flags = np.frombuffer(entries, dtype="<u8") >> np.uint64(61)
    return not bool(np.any(flags & np.uint64(0b101) == np.uint64(0b100)))  # present, not a file page


def _file_mapping(start: int, end: int):
    """The permissions (``r--s``, ``rw-p``, ...) of the one mapping of a file that holds
    ``[start, end)`` (``/proc/self/maps``: an inode other than 0 and a path), else None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            if low <= start < high:
                mapped = end <= high and fields[4] != "0" and len(fields) == 6 and fields[5].startswith("/")
                return fields[1] if mapped else None
    return None
