"""What the partitioner claims: split regions around a declined op, buffers, sizes."""

import pytest
import runtimes
import torch

import etmlx
from etmlx.runtime_shim.errors import PteFormatError
from lowering_harness import assert_close, check_parity, lower


class DeclinedInTheMiddle(torch.nn.Module):
    """Two MLX regions around a sort in float64, which MLX does not have."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.first(x))
        h = torch.sort(h.double(), dim=-1).values.to(h.dtype)
        return torch.sigmoid(self.second(h))


def test_partial_delegation_runs_and_is_reported():
    module, x = DeclinedInTheMiddle().eval(), torch.randn(3, 8)
    lowered = lower(module, (x,))
    with torch.no_grad():
        assert_close(etmlx.load(lowered.pte).forward(x), module(x))
    # ExecuTorch's kernel library has no sort: its runtime cannot run this program, and
    # says so by name at load rather than as an error code.
    with pytest.raises(PteFormatError, match=r"ExecuTorch's runtime has no kernel for aten::sort\.values,"):
        etmlx.load(lowered.pte, runtime="executorch")
    assert len(lowered.delegates) == 2
    assert [k.split(".")[0] for k in lowered.kernels] == ["dim_order_ops::_to_dim_order_copy", "aten::sort"] + [
        "dim_order_ops::_to_dim_order_copy"
    ]
    assert [d["nodes"] for d in lowered.delegates] == [["Addmm", "Relu"], ["Addmm", "Sigmoid"]]
    assert not lowered.report.fully_delegated
    (reason,) = lowered.report.operators["aten::sort"].declined
    assert "float64" in reason[1]
    assert "aten::sort" in lowered.report.summary()


class Counter(torch.nn.Module):
    """A buffer with a non-zero initial value, updated in place on every call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.arange(4, dtype=torch.float32) + 10)

    def forward(self, x):
        self.total.add_(x)
        return self.total * 2


def test_mutable_buffer_state_across_calls():
    eager = Counter()
    lowered = lower(Counter(), (torch.ones(4),))
    (delegate,) = lowered.delegates
    assert delegate["buffers"] and lowered.kernels == []
    for step in range(3):
        x = torch.full((4,), float(step + 1))
        assert_close(lowered.program.forward(x), eager(x))


def test_two_loads_do_not_share_state():
    lowered = lower(Counter(), (torch.ones(4),))
    first, second = runtimes.load(lowered.pte), runtimes.load(lowered.pte)
    first.forward(torch.ones(4))
    first.forward(torch.ones(4))
    assert_close(second.forward(torch.ones(4)), (torch.arange(4.0) + 11) * 2)


class Float64Middle(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        z = (y.double() * 3).exp()  # float64: declined, runs on the CPU fallback
        return z.float() + 1


def test_float64_is_declined_but_correct():
    lowered = check_parity(Float64Middle(), (torch.randn(5),))
    assert any("float64" in reason for _, reason in lowered.report.operators["aten::exp"].declined)
    assert "aten::exp.out" in lowered.kernels
    assert "Relu" in lowered.nodes


def test_plain_executorch_route_runs_in_etmlx():
    """The README's route through ExecuTorch's own API, with no etmlx helper in between."""
    from executorch.exir import to_edge_transform_and_lower

    from etmlx.partitioner import MlxPartitioner
    from examples import models

    module, inputs, _ = models.encoder_block()
    pte = to_edge_transform_and_lower(torch.export.export(module, inputs), partitioner=[MlxPartitioner()]).to_executorch()
    with torch.no_grad():
        expected = module(*inputs)
    assert_close(runtimes.load(pte.buffer).forward(*inputs), expected)
