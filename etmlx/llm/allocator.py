"""The C allocator's policy while a GGUF file is exported, where glibc's default
fragments the heap.

glibc serves an allocation below its mmap threshold from its heap, and raises that
threshold (up to 32 MiB) each time it frees a block that had a mapping of its own.
Decoding a GGUF file's blocks (once when it loads, again when lowering packs them) makes
and drops thousands of arrays of a few MiB (gguf's ``dequantize`` of each block of rows,
the fields decoded from it): they come from the heap, interleave with what stays, and the
heap's freed middle is never given back. Loading a 1B model's file held 2.5 GiB after it
for 1 GiB of model, and the export peaked at 4.3 GiB; with blocks of 4 MiB and more kept
apart, 2.5 GiB (2.7 if only while it loads), for 3% more time. Not for a safetensors
checkpoint: its lowering took 16% longer (a mapping made and zeroed per temporary) for a
7% lower peak.
"""

import contextlib
import ctypes
import sys

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
LARGE_BLOCK = 4 * 2**20
AFTER = 32 * 2**20  # where glibc's own threshold ends up once large blocks were freed


@contextlib.contextmanager
def large_blocks_apart():
    """Inside, blocks of ``LARGE_BLOCK`` bytes and more each get a mapping of their own,
    returned to the system when freed (glibc's ``MALLOC_MMAP_THRESHOLD_``); after, the
    threshold is ``AFTER``. Elsewhere (macOS, musl) nothing changes."""
    mallopt = _mallopt()
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)
    try:
        yield
    finally:
        if mallopt is not None:
            mallopt(M_MMAP_THRESHOLD, AFTER)


def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt in this C library
        return None
