"""Limits that keep a small, damaged or hostile file from making a runtime allocate
without bound. A file past one fails with a clear error before anything that size is
allocated; the environment variables raise them for models that truly need more.

- ``ETMLX_MAX_ARENA_BYTES``: one memory-planned arena of a method (default 16 GiB).
- ``ETMLX_MAX_ARRAY_BYTES``: one array an MLX node produces (default 16 GiB).

The native backend reads the same variables (native/src/resource_limits.h). Each is read
once, when first needed, so a malformed value fails the load that needs it, not the import.
"""

import functools
import os

GIB = 1 << 30


def _limit(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of bytes, not {value!r}") from None


@functools.cache
def max_arena_bytes() -> int:
    return _limit("ETMLX_MAX_ARENA_BYTES", 16 * GIB)


@functools.cache
def max_array_bytes() -> int:
    return _limit("ETMLX_MAX_ARRAY_BYTES", 16 * GIB)
