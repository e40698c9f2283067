"""Passes over the lowered IR graph, before it is serialized."""

from etmlx.serializer.generated.etmlx_ir.ValueKind import ValueKind
from etmlx.serializer.ir import TidT, read_operands


def remove_dead_nodes(graph) -> None:
    """Drops nodes whose results nothing reads: the pieces a fused rule (RmsNorm, say)
    replaced, and results the edge graph computed but never used."""
    live_tensors = {v.slot for v in graph.outputs if v.kind == ValueKind.Tensor}
    live_ints = {v.slot for v in graph.outputs if v.kind == ValueKind.Int}
    live_tensors |= {b.update for b in graph.buffers or [] if b.hasUpdate}
    kept = []
    for node in reversed(graph.nodes or []):
        op = node.op
        out = getattr(op, "out", None)
        written_int = getattr(op, "outInt", None)
        if out is not None and out.idx not in live_tensors:
            continue
        if out is None and written_int is not None and written_int.value not in live_ints:
            continue
        kept.append(node)
        for _, ref in read_operands(op):
            (live_tensors if isinstance(ref, TidT) else live_ints).add(ref.idx if isinstance(ref, TidT) else ref.value)
    graph.nodes = kept[::-1]
    graph.constants = [c for c in graph.constants or [] if c.slot in live_tensors]
