"""What the tests of ``etmlx.llm.causal_lm`` read from a .pte (how attention reaches the
cache), and how they step one."""

import torch

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


def assert_steps_match(program, tokens: list, expected, prefill: int) -> None:
    """``tokens[:prefill]`` in one call, then the rest one a call: the last position's
    logits equal ``expected``'s row for it at every call."""
    first = program.forward(torch.tensor([tokens[:prefill]]), torch.arange(prefill))
    torch.testing.assert_close(torch.as_tensor(first)[0], expected[prefill - 1], rtol=1e-4, atol=1e-5)
    for position in range(prefill, len(tokens)):
        logits = program.forward(torch.tensor([[tokens[position]]]), torch.tensor([position]))
        torch.testing.assert_close(torch.as_tensor(logits)[0], expected[position], rtol=1e-4, atol=1e-5)
