"""Cancels the transposes that layout changes put around elementwise work.

PyTorch computes convolutions channels-first, MLX channels-last, so lowering wraps every
convolution and pooling in a transpose each way (``rules/convolution.py``). Between two
convolutions a network mostly runs elementwise operations -- a batch norm's scale and
shift, an activation, a residual sum, a squeeze-and-excitation gate -- which compute the
same values in either layout. This pass finds each *region* of such operations that a
transpose of permutation P feeds, and, where that removes more transposes than it adds,
runs the region in the layout before P: a transpose into the region and the inverse
transposes out of it disappear, and MLX's convolutions receive contiguous channels-last
arrays instead of copying strided views.

Within a region every value has P's rank; a value is held as ``transpose(value, P⁻¹)``.
Each elementwise operation computes the same numbers at permuted positions, so results
are equal to the bit; a reduction over the region's values (a mean over the spatial axes)
reduces the same axes, renumbered, in another order of summation: equal to float32
rounding. Constants broadcast into a region are re-shaped when that keeps their bytes
in order (a per-channel (C, 1, 1) becomes (1, 1, 1, C)); a value the region cannot
re-lay out for free is transposed where it enters or leaves, and counted as a cost.
"""

from dataclasses import dataclass, field

from etmlx.serializer.generated.etmlx_ir import NamedTensor, Node, Op, Transpose
from etmlx.serializer.generated.etmlx_ir.ValueKind import ValueKind
from etmlx.serializer.ir import OP_NAMES, TidT, read_operands, tid

ELEMENTWISE = ("Unary", "Binary", "Where", "AsType")


def _reduce_axes(op, perm: list) -> None:
    op.axes = [perm[axis % len(perm)] for axis in op.axes]


def _pad_widths(op, perm: list) -> None:
    pairs = [op.padWidth[2 * axis : 2 * axis + 2] for axis in range(len(perm))]
    inverse = _inverse(perm)
    op.padWidth = [width for axis in range(len(perm)) for width in pairs[inverse[axis]]]


# Operations other than elementwise ones that a region runs in its layout: how their
# arguments are renumbered for it.
RENUMBERED = {"Reduce": _reduce_axes, "Pad": _pad_widths}


def _inverse(perm: list) -> list:
    inverse = [0] * len(perm)
    for axis, source in enumerate(perm):
        inverse[source] = axis
    return inverse


def cancel_transposes(graph, ranks: dict) -> None:
    """Rewrites ``graph`` region by region; ``ranks``: tensor slot -> rank, where the
    lowering knows it (the pass derives the rest from the nodes)."""
    tried = set()
    while True:
        view = _GraphView(graph, ranks)
        for node in view.nodes:
            if OP_NAMES[node.opType] == "Transpose" and node.op.out.idx not in tried:
                region = _grow(view, node)
                tried |= region.slots if region else {node.op.out.idx}
                if region is not None and region.removed() > region.added():
                    tried |= _rewrite(graph, view, region)
                    break
        else:
            return


class _GraphView:
    """Who writes and who reads each tensor slot, and every slot's rank where known."""

    def __init__(self, graph, ranks: dict):
        self.graph, self.nodes = graph, list(graph.nodes or [])
        self.writer, self.readers = {}, {}
        for node in self.nodes:
            for _, ref in read_operands(node.op):
                if isinstance(ref, TidT):
                    self.readers.setdefault(ref.idx, []).append(node)
            out = getattr(node.op, "out", None)
            if isinstance(out, TidT):
                self.writer[out.idx] = node
        self.constants = {c.slot: c for c in graph.constants or []}
        self.outside_reads = {v.slot for v in graph.outputs or [] if v.kind == ValueKind.Tensor}
        self.outside_reads |= {b.update for b in graph.buffers or [] if b.hasUpdate}
        # A mutable buffer keeps its layout: a KV cache read through anything but its
        # window's Slice could no longer grow with the window (growable_buffers.py).
        self.buffers = {b.initial.slot for b in graph.buffers or []}
        self.ranks = dict(ranks)
        self.ranks.update({slot: len(c.shape or []) for slot, c in self.constants.items()})
        for node in self.nodes:
            rank = self._rank_of(node)
            if rank is not None:
                self.ranks.setdefault(node.op.out.idx, rank)

    def _rank_of(self, node):
        table, op = OP_NAMES[node.opType], node.op
        if table == "Transpose":
            return len(op.perm)
        if table == "Scalar":
            return 0
        if table in ELEMENTWISE:
            operands = [self.ranks.get(ref.idx) for _, ref in read_operands(op) if isinstance(ref, TidT)]
            return None if None in operands else max(operands)
        if table == "Reduce" and op.x.idx in self.ranks:
            return self.ranks[op.x.idx] - (0 if op.keepdims else len(set(op.axes)))
        return None


@dataclass
class _Region:
    """Slots held in the layout before ``perm`` once rewritten, and what that takes."""

    perm: list
    slots: set = field(default_factory=set)
    entries: dict = field(default_factory=dict)  # slot -> the Transpose(perm) node writing it
    outside_writes: set = field(default_factory=set)  # slots another operation writes: transposed in
    exits: list = field(default_factory=list)  # Transpose(inverse) nodes reading the region
    renumbered: list = field(default_factory=list)  # nodes whose axes the layout renumbers
    reshaped: dict = field(default_factory=dict)  # constant slot -> its shape in the region's layout
    outside_reads: set = field(default_factory=set)  # slots read outside the region: transposed out

    @property
    def inverse(self) -> list:
        return _inverse(self.perm)

    def removed(self) -> int:
        return sum(slot not in self.outside_reads for slot in self.entries) + len(self.exits)

    def added(self) -> int:
        transposed_out = self.outside_reads - set(self.entries) - self.outside_writes
        return len(self.outside_writes) + len(transposed_out)


def _grow(view: _GraphView, transpose) -> "_Region | None":
    """The region a Transpose node's output belongs to, or None where a value in it
    cannot be re-laid out (a rank the pass does not know, a broadcast of lower rank)."""
    region = _Region(list(transpose.op.perm))
    rank, inverse = len(region.perm), region.inverse
    region.slots.add(transpose.op.out.idx)
    pending = [transpose.op.out.idx]

    def join(slot) -> bool:
        """Whether an operand of the region's work can be read in its layout: a 0-d value
        as it is, a constant re-shaped over its bytes, a value of the region's rank as one
        of its slots (its writer then looked at in turn)."""
        if slot in region.slots or view.ranks.get(slot) == 0:
            return True
        if slot in view.constants and view.ranks[slot] <= rank:
            shape = _shape_in_layout(view.constants[slot].shape or [], inverse)
            if shape is not None:
                region.reshaped[slot] = shape
                return True
        if view.ranks.get(slot) != rank or slot in view.buffers:
            return False
        region.slots.add(slot)
        pending.append(slot)
        return True

    while pending:
        slot = pending.pop()
        writer = view.writer.get(slot)
        table = OP_NAMES[writer.opType] if writer else None
        if table == "Transpose" and list(writer.op.perm) == region.perm:
            region.entries[slot] = writer
        elif _follows(writer, rank):
            if table in RENUMBERED and writer not in region.renumbered:
                region.renumbered.append(writer)
            if not all(join(ref.idx) for _, ref in read_operands(writer.op) if isinstance(ref, TidT)):
                return None
        else:
            region.outside_writes.add(slot)
        if slot in view.outside_reads:
            region.outside_reads.add(slot)
        for reader in view.readers.get(slot, []):
            table = OP_NAMES[reader.opType]
            if _follows(reader, rank):
                if reader in region.renumbered:
                    continue
                if table in RENUMBERED:
                    region.renumbered.append(reader)
                if not join(reader.op.out.idx) or not all(
                    join(ref.idx) for _, ref in read_operands(reader.op) if isinstance(ref, TidT)
                ):
                    return None
            elif table == "Transpose" and list(reader.op.perm) == inverse:
                if reader not in region.exits:
                    region.exits.append(reader)
            elif table == "Reduce" and _keeps_order(reader.op.axes, region.perm):
                if reader not in region.renumbered:
                    region.renumbered.append(reader)
            else:
                region.outside_reads.add(slot)
    return region


def _follows(node, rank: int) -> bool:
    """Whether ``node`` computes its result in whatever layout its region's values have
    (its axes renumbered where it names any)."""
    if node is None:  # an input of the graph, or a constant
        return False
    table, op = OP_NAMES[node.opType], node.op
    if table == "Reduce":
        return op.keepdims
    if table == "Pad":
        return len(op.padWidth or []) == 2 * rank
    return table in ELEMENTWISE


def _shape_in_layout(shape: list, inverse: list) -> "list | None":
    """A constant's shape, broadcast to the region's rank and permuted into its layout,
    where that leaves its bytes in the same order (its sizes other than 1 keep their
    order); None otherwise."""
    padded = [1] * (len(inverse) - len(shape)) + list(shape)
    permuted = [padded[axis] for axis in inverse]
    order = [axis for axis in inverse if padded[axis] != 1]
    return permuted if order == sorted(order) else None


def _keeps_order(axes, perm: list) -> bool:
    """Whether a reduction dropping ``axes`` leaves the other axes in the same order in
    the region's layout as before: its result is then the same array."""
    dropped = {a % len(perm) for a in axes}
    kept = [perm[a] for a in range(len(perm)) if a not in dropped]
    return kept == sorted(kept)


def _rewrite(graph, view: _GraphView, region: _Region) -> set:
    """Runs ``region`` in its new layout; returns the slots of the transposes it adds."""
    inverse = region.inverse
    new, old = {}, {}  # region slot -> the slot holding it in the region's / the original layout
    inserted = {}  # node (or None: before the first) -> nodes to insert after it
    for slot in region.slots:
        if slot in region.entries:
            new[slot], old[slot] = region.entries[slot].op.x.idx, slot
        elif slot in region.outside_writes:
            old[slot] = slot
            new[slot] = _transposed(graph, inserted, view.writer.get(slot), slot, inverse)
        else:
            new[slot] = slot
            if slot in region.outside_reads:
                old[slot] = _transposed(graph, inserted, view.writer[slot], slot, region.perm)
    constants = {slot: _reshaped_constant(graph, view.constants[slot], shape)
                 for slot, shape in region.reshaped.items()}
    inside = {id(view.writer[s]) for s in region.slots if s not in region.entries and s not in region.outside_writes}
    inside |= {id(node) for node in region.renumbered}
    removed = {id(node) for node in region.exits}
    removed |= {id(node) for slot, node in region.entries.items() if slot not in region.outside_reads}
    renamed = {exit.op.out.idx: new[exit.op.x.idx] for exit in region.exits}

    def follow(slot):
        return renamed.get(slot, slot)

    def outside(slot):
        return follow(old.get(slot, slot))

    for node in region.renumbered:
        RENUMBERED[OP_NAMES[node.opType]](node.op, region.perm)
    nodes = inserted.get(None, [])
    for node in view.nodes:
        if id(node) in removed:
            continue
        if id(node) in inside:
            _read_from(node.op, lambda slot: follow(new.get(slot, constants.get(slot, slot))))
        else:
            _read_from(node.op, outside)
        nodes.append(node)
        nodes.extend(inserted.get(id(node), []))
    graph.nodes = nodes
    for value in graph.outputs or []:
        if value.kind == ValueKind.Tensor:
            value.slot = outside(value.slot)
    for buffer in graph.buffers or []:
        if buffer.hasUpdate:
            buffer.update = outside(buffer.update)
    return {node.op.out.idx for added in inserted.values() for node in added}


def _read_from(op, slot_for) -> None:
    """Points every tensor operand of ``op`` at ``slot_for(its slot)``. Operands are
    replaced, not changed in place: lowering shares one ``Tid`` object between the node
    that writes a slot and the nodes that read it."""
    for name in {name for name, _ in read_operands(op)}:
        value = getattr(op, name)
        if isinstance(value, TidT):
            setattr(op, name, tid(slot_for(value.idx)))
        elif isinstance(value, list) and any(isinstance(item, TidT) for item in value):
            setattr(op, name, [tid(slot_for(item.idx)) if isinstance(item, TidT) else item for item in value])


def _transposed(graph, inserted: dict, writer, slot: int, perm: list) -> int:
    """A new Transpose of ``slot`` by ``perm``, placed right after its writer; its slot."""
    op = Transpose.TransposeT()
    op.x, op.perm, op.out = tid(slot), list(perm), tid(graph.numTensorSlots)
    graph.numTensorSlots += 1
    node = Node.NodeT()
    node.opType, node.op = Op.Op.Transpose, op
    inserted.setdefault(id(writer) if writer is not None else None, []).append(node)
    return op.out.idx


def _reshaped_constant(graph, constant, shape: list) -> int:
    """The same bytes as ``constant`` under another shape, in a new slot."""
    reshaped = NamedTensor.NamedTensorT()
    reshaped.slot, reshaped.key, reshaped.dtype, reshaped.shape = graph.numTensorSlots, constant.key, constant.dtype, shape
    graph.numTensorSlots += 1
    graph.constants.append(reshaped)
    return reshaped.slot
