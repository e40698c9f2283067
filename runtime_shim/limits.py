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
import re

from etmlx.serializer.constants import DEFAULT_MAX_ARRAY_BYTES


def parse_byte_count(text: str):
    """A limit's value: decimal digits only, at most 2^63 - 1; None otherwise (a sign,
    spaces, an empty string). The native backend reads the same (``parse_byte_count``
    in native/src/resource_limits.h)."""
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) >= 1 << 63:
        return None
    return int(text)


def _limit(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    value = parse_byte_count(text)
    if value is None:
        raise ValueError(f"{name} must be a number of bytes, not {text!r}")
    return value


@functools.cache
def max_arena_bytes() -> int:
    return _limit("ETMLX_MAX_ARENA_BYTES", 16 << 30)


@functools.cache
def max_array_bytes() -> int:
    return _limit("ETMLX_MAX_ARRAY_BYTES", DEFAULT_MAX_ARRAY_BYTES)
