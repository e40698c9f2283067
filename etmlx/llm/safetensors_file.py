"""A safetensors file checked before it is mapped: a truncated or damaged checkpoint gets
one error that names the file and the tensor, instead of a library's message (or a
fault when a mapped page past the end is read)."""

import json
import os
import struct

from etmlx.errors import ExportError

# Bytes per value of safetensors' dtypes.
WIDTHS = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
          "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
LARGEST_HEADER = 100 * 2**20  # safetensors' own limit


def check(path) -> dict:
    """The header of the safetensors file ``path`` ({tensor: {dtype, shape,
    data_offsets}}), once every tensor lies inside the file and fills its bytes exactly."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        start = f.read(8)
        if len(start) < 8:
            raise ExportError(f"{path}: not a safetensors file ({size} bytes, no header)")
        (length,) = struct.unpack("<Q", start)
        if length > min(LARGEST_HEADER, size - 8):
            raise ExportError(f"{path}: damaged safetensors file (a {length}-byte header in a {size}-byte file)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ExportError(f"{path}: damaged safetensors header ({error})") from None
    if not isinstance(header, dict):
        raise ExportError(f"{path}: damaged safetensors header (not a table of tensors)")
    data = size - 8 - length
    for name, entry in header.items():
        if name != "__metadata__":
            _check_entry(path, name, entry, data)
    return header


def data_start(path) -> int:
    """Where the tensors' bytes begin in the safetensors file ``path`` (after its header)."""
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def _check_entry(path, name: str, entry, data: int) -> None:
    try:
        width = WIDTHS[entry["dtype"]]
        begin, end = (int(offset) for offset in entry["data_offsets"])
        count = 1
        for dim in entry["shape"]:
            count *= int(dim)
    except (TypeError, KeyError, ValueError) as error:
        raise ExportError(f"{path}: tensor {name}: damaged header entry {entry!r} ({error!r})") from None
    if end > data:
        raise ExportError(f"{path}: tensor {name} ends at byte {end} of the data, which holds {data}: "
                          "the file is truncated")
    if not 0 <= begin <= end or end - begin != count * width:
        raise ExportError(f"{path}: tensor {name}: bytes {begin}..{end} for {entry['dtype']} {entry['shape']} "
                          f"({count * width} bytes)")
