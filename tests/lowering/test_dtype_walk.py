"""The registry walk: every lowering rule, in every dtype MLX computes, against eager.

Each rule has a sample call (``dtype_samples.py``). For each dtype, the samples that
eager PyTorch computes in it go into one program, exported with every operator kept
whole. The partitioner's verdicts come first: the calls the rules take then run as one
fully delegated program that must equal eager on every runtime; each declined call must
name its reason. So no rule accepts a dtype that no test ran. (Which IR operations each runtime handles is compared
with the schema in tests/native/test_stock_api.py.)
"""

import pytest
import torch
from dtype_samples import REWRITTEN, SIZE_RULES, samples
from lowering_harness import assert_close
from ruletest import edge_whole, lower_whole

import etmlx.lowering.rules  # noqa: F401  (registers every rule)
from etmlx.lowering.dtypes import dtype_name
from etmlx.lowering.registry import RULES
from etmlx.partitioner import MlxPartitioner

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
]


# rule -> the dtypes it took in this session's walk, for the last test.
TAKEN: dict = {}


def _inputs(dtype):
    """``x`` signed, ``y`` positive (divisors, exponents), ``d`` distinct (no ties to sort)."""
    distinct = torch.randperm(48).reshape(2, 3, 8)
    if dtype == torch.bool:
        return torch.rand(2, 3, 4, 5) > 0.5, torch.ones(2, 3, 4, 5, dtype=torch.bool), distinct % 2 == 0
    if dtype.is_floating_point:
        return (torch.randn(2, 3, 4, 5) * 2).to(dtype), (torch.rand(2, 3, 4, 5) * 2.5 + 0.5).to(dtype), distinct.to(dtype)
    low = 0 if dtype == torch.uint8 else -6
    return torch.randint(low, 7, (2, 3, 4, 5)).to(dtype), torch.randint(1, 4, (2, 3, 4, 5)).to(dtype), distinct.to(dtype)


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


class Samples(torch.nn.Module):
    """Every sample in one program; outputs flattened in the samples' order."""

    def __init__(self, calls: dict):
        super().__init__()
        self.calls = calls

    def forward(self, x, y, d):
        return tuple(output for call in self.calls.values() for output in _as_tuple(call(x, y, d)))


def _computed_by_eager(calls: dict, inputs) -> dict:
    """rule -> its sample's outputs, for the samples eager PyTorch computes in this dtype."""
    expected = {}
    for rule, call in calls.items():
        try:
            expected[rule] = _as_tuple(call(*inputs))
        except (RuntimeError, TypeError, NotImplementedError, AssertionError):
            continue  # e.g. bitwise_not of floats: not a call anyone can write
    return expected


def test_every_rule_has_a_sample():
    assert set(samples(torch.float32)) == set(RULES) - SIZE_RULES - set(REWRITTEN)
    for name, becomes in REWRITTEN.items():
        assert RULES[name] == RULES[becomes], f"{name} is walked as {becomes}, but has a rule of its own"


def _verdicts(calls: dict, inputs) -> dict:
    """The partitioner's verdicts on the samples' calls (``OperatorReport`` by operator),
    from the edge program alone: nothing is lowered."""
    edge, _ = edge_whole(Samples(calls).eval(), inputs)
    partitioner = MlxPartitioner()
    partitioner.partition(edge.exported_program())
    return partitioner.report.operators


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_every_rule_in_every_dtype_agrees_with_eager(dtype):
    """The calls a rule takes run fully on MLX and equal eager on every runtime; the calls
    it declines say why (ExecuTorch's own kernels, which then run them, are not walked)."""
    torch.manual_seed(0)
    inputs = _inputs(dtype)
    calls = samples(dtype)
    with torch.no_grad():
        expected = _computed_by_eager(calls, inputs)
    verdicts = _verdicts({rule: calls[rule] for rule in expected}, inputs)
    unreached = [rule for rule in expected if rule not in verdicts]
    assert not unreached, f"samples whose operator never reached the partitioner: {unreached}"
    unexplained = [rule for rule in expected if any(not reason for _, reason in verdicts[rule].declined)]
    assert not unexplained, f"declined without a reason: {unexplained}"
    taken = {rule: calls[rule] for rule in expected if not verdicts[rule].declined}
    for rule in taken:
        TAKEN.setdefault(rule, set()).add(dtype)

    lowered, _ = lower_whole(Samples(taken).eval(), inputs)
    assert lowered.kernels == [], f"left outside MLX: {lowered.kernels}\n{lowered.report.to_text()}"
    outputs = iter(lowered.program.forward(*inputs))
    disagreeing = []
    for rule in taken:
        for value in expected[rule]:
            try:
                assert_close(next(outputs), value)
            except AssertionError as error:
                disagreeing.append(f"{rule}: {str(error)[:400]}")  # integer tensors print whole
    assert not disagreeing, "\n".join(disagreeing)


def test_every_rule_is_walked_in_some_dtype(whole_file):
    """A sample no dtype lets through would make the walk vacuous for its rule."""
    assert set(samples(torch.float32)) - set(TAKEN) == set()
