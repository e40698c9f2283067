"""Marks the KV caches whose memory can follow the tokens held (IR ``grow_axis``).

A windowed causal LM (``etmlx.llm.windowed_cache``) writes each cache with one IndexPut at
checked positions along the sequence axis, and reads it only through
``Slice(0, window)`` along that axis, ``window`` an integer input of the delegate. Such
a buffer never needs more than ``window`` slots in a call, so the runtimes keep only as
many as calls have needed (they extend it with zeros before a call, up to the capacity)
instead of the whole capacity from the first token.

Before a buffer is marked, this pass proves from the graph that the call cannot touch a
slot past the window: the check guarding the write positions, which bounds them by the
capacity, is tightened to the window itself (a position past it, which only positions
out of order can give, raises IndexRangeError instead of landing in a slot that is not
there). A buffer that starts with anything but zeros, is read any other way, or whose
writes go through a check another node also reads, stays whole."""

import collections

from etmlx.serializer.generated.etmlx_ir.ValueKind import ValueKind
from etmlx.serializer.ir import OP_NAMES, TidT, int_or_slot, read_operands


def grow_with_the_window(graph, holds_zeros) -> None:
    """Sets ``grow_axis``/``grow_extent`` on every buffer of ``graph`` that qualifies
    (``holds_zeros(named_tensor)``: whether its initial value is all zeros), drops its
    initial value's key (nothing is stored for it) and tightens its write check."""
    readers, writers = collections.defaultdict(list), {}
    for node in graph.nodes or []:
        for _, ref in read_operands(node.op):
            if isinstance(ref, TidT):
                readers[ref.idx].append(node)
        out = getattr(node.op, "out", None)
        if out is not None:
            writers[out.idx] = node
    size_inputs = {v.slot for v in graph.inputs or [] if v.kind == ValueKind.Int}
    read_elsewhere = {v.slot for v in graph.outputs or [] if v.kind == ValueKind.Tensor}
    growable = {}  # buffer -> (its write's check node, axis, extent slot)
    for buffer in graph.buffers or []:
        plan = _growth(buffer, readers, writers, size_inputs, read_elsewhere)
        if plan is not None and holds_zeros(buffer.initial):
            growable[id(buffer)] = (buffer, *plan)
    by_check = collections.defaultdict(list)
    for buffer, check, axis, extent in growable.values():
        by_check[id(check)].append((buffer, check, axis, extent))
    for entries in by_check.values():
        check, extents = entries[0][1], {extent for _, _, _, extent in entries}
        writes = {id(node) for node in readers[check.op.out.idx]}
        if len(extents) != 1 or writes != {id(readers[b.initial.slot][0]) for b, *_ in entries}:
            continue  # the check guards something else too, or writes under two windows
        (extent,) = extents
        check.op.size, check.op.wraps = int_or_slot(extent, is_slot=True), False
        for buffer, _, axis, _ in entries:
            buffer.growAxis, buffer.growExtent = axis, extent
            buffer.initial.key = ""


def _growth(buffer, readers, writers, size_inputs, read_elsewhere):
    """(the CheckIndex guarding the buffer's one write, its axis, the window's int slot)
    if the buffer is written once along one axis and read only in windows along it."""
    slot, rank = buffer.initial.slot, len(buffer.initial.shape or [])
    writes = readers[slot]
    if not buffer.hasUpdate or len(writes) != 1 or OP_NAMES[writes[0].opType] != "IndexPut":
        return None
    write = writes[0].op
    if write.out.idx != buffer.update or write.x.idx != slot or write.accumulate or len(write.dims or []) != 1:
        return None
    if buffer.update in read_elsewhere or write.values.idx == slot:
        return None
    axis = write.dims[0] % rank if rank else None
    check = writers.get(write.indices[0].idx) if len(write.indices or []) == 1 else None
    if axis is None or check is None or OP_NAMES[check.opType] != "CheckIndex":
        return None
    if check.op.size.isSlot or check.op.size.value != buffer.initial.shape[axis]:
        return None
    extents = set()
    for reader in readers[buffer.update]:
        op = reader.op
        if OP_NAMES[reader.opType] != "Slice" or op.x.idx != buffer.update or op.axis % rank != axis:
            return None
        if op.start.isSlot or op.start.value != 0 or op.step != 1 or not op.stop.isSlot:
            return None
        extents.add(op.stop.value)
    if len(extents) != 1 or not extents <= size_inputs:
        return None
    return check, axis, extents.pop()
