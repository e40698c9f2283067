"""The C allocator's policy for a long export, where glibc's default fragments the heap.

glibc serves an allocation below its mmap threshold from its heap, and raises that
threshold (up to 32 MiB) each time it frees a block that had a mapping of its own. An
export then makes and drops thousands of tensors of a few MiB (a weight's rows being
decoded, packed, written): they come from the heap, interleave with objects that stay,
and the heap's freed middle is never given back. Exporting a 1B model's GGUF file
peaked at 4.2 GiB so, 2.9 GiB with blocks of 4 MiB and more kept apart (119 s against
115 s: a mapping per block costs little at that size; at 1 MiB it cost 17%).
"""

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
LARGE_BLOCK = 4 * 2**20


def keep_large_blocks_apart() -> bool:
    """From now on, in this process, blocks of ``LARGE_BLOCK`` bytes and more each get a
    mapping of their own, returned to the system when freed (glibc's
    ``MALLOC_MMAP_THRESHOLD_``); whether the allocator took it. Elsewhere (macOS, musl)
    nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK))
    except (OSError, AttributeError):  # no mallopt in this C library
        return False
