"""What the partitioner claims: split regions around a declined op, buffers, sizes."""

import pytest
import runtimes
import torch

import etmlx
from etmlx.runtime_shim.errors import PteFormatError
from lowering_harness import Fn, assert_close, check_parity, lower


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
    assert [d["nodes"] for d in lowered.delegates] == [["Transpose", "Addmm", "Scalar", "Maximum"], ["Transpose", "Addmm", "Sigmoid"]]
    assert not lowered.report.fully_delegated
    (reason,) = lowered.report.operators["aten::sort"].declined
    assert "float64" in reason[1]
    assert "aten::sort" in lowered.report.summary()


class ReadAroundADeclinedCall(torch.nn.Module):
    """A buffer read on both sides of a declined call and written after it: two MLX
    delegates read it, the second computes its new value (an LLM's cache position, read
    by every layer, with one layer's call declined)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.zeros(1))

    def forward(self, x, scale):
        h = torch.sort((x * self.scale).double(), -1).values.float()  # float64: declined
        out = h + self.scale
        self.scale.copy_(scale * 2)  # an input named like the buffer, too
        return out


def test_a_buffer_several_delegates_share_stays_with_executorch():
    """ExecuTorch's own tagging gave the buffer to the first delegate while the second
    wrote it: every call after the first computed with a stale value, silently. The
    buffer now stays outside both delegates, which read it as an input."""
    module, lowered_from = ReadAroundADeclinedCall(), ReadAroundADeclinedCall()
    x = torch.randn(2, 4)
    lowered = lower(lowered_from, (x, torch.tensor([3.0])))
    assert len(lowered.delegates) == 2 and not any(d.get("buffers") for d in lowered.delegates)
    program = etmlx.load(lowered.pte)  # ExecuTorch's kernel library has no sort
    for scale in (3.0, 1.0, -2.0):
        assert_close(program.forward(x, torch.tensor([scale])), module(x, torch.tensor([scale])))
    with pytest.raises(PteFormatError, match=r"no kernel for aten::sort.values, which MLX declined"):
        etmlx.load(lowered.pte, runtime="executorch")


def test_a_size_passed_from_one_delegate_to_another():
    """The row count, read in the first delegate, also shapes the second one's reshape:
    the first returns it as an integer, which the Python runtime's plan now stores."""
    from torch.export import Dim

    def fn(x):
        rows = x.shape[0]
        h = torch.sort((x * rows).double(), -1).values.float()  # float64: declined
        return h.reshape(rows * 2, -1) + rows

    lowered = lower(Fn(fn), (torch.randn(4, 6),), {"args": ({0: Dim("rows", min=2, max=16)},)})
    assert "SymSize" in lowered.delegates[0]["nodes"] and "SymSize" not in lowered.delegates[1]["nodes"]
    program = etmlx.load(lowered.pte)
    for rows in (4, 7):
        x = torch.randn(rows, 6)
        assert_close(program.forward(x), fn(x))


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
    assert "Maximum" in lowered.nodes


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
