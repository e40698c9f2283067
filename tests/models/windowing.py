"""What the tests of ``etmlx.causal_lm`` read from a .pte: how attention reaches the cache."""

from etmlx.runtime_shim.pte_file import read_pte
from etmlx.serializer import deserialize, node_type
from etmlx.serializer.ir import TidT, read_operands


def sdpa_operand_slices(path, method: str = "forward") -> list:
    """For each operand (k, v, mask) of each Sdpa in ``method``'s delegate, the first
    Slice found walking back through the ops that produce it (first input first), or None."""
    pte = read_pte(path)
    (plan,) = [p for p in pte.program.plans if p.name == method]
    graph = deserialize(pte.delegate_data(plan.delegates[0]))
    producer = {node.op.out.idx: node for node in graph.nodes if getattr(node.op, "out", None) is not None}

    def slice_behind(tid):
        node = producer.get(tid.idx)
        while node is not None and node_type(node) != "Slice":
            tensors = [item for _, item in read_operands(node.op) if isinstance(item, TidT)]
            node = producer.get(tensors[0].idx) if tensors else None
        return node

    sdpas = [node.op for node in graph.nodes if node_type(node) == "Sdpa"]
    return [slice_behind(getattr(op, name)) for op in sdpas for name in ("k", "v", "mask")]


def reads_a_window(path, method: str = "forward") -> bool:
    """Every Sdpa reads keys, values and mask through a Slice whose stop is a run-time size."""
    slices = sdpa_operand_slices(path, method)
    return bool(slices) and all(s is not None and s.op.stop.isSlot for s in slices)


def window_slices(path, method: str = "forward") -> int:
    """How many Slice nodes of ``method``'s delegate stop at a run-time size (a window)."""
    pte = read_pte(path)
    (plan,) = [p for p in pte.program.plans if p.name == method]
    graph = deserialize(pte.delegate_data(plan.delegates[0]))
    return sum(1 for node in graph.nodes if node_type(node) == "Slice" and node.op.stop.isSlot)
