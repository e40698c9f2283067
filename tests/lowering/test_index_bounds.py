"""Run-time indices out of range raise IndexError on every runtime, as PyTorch does,
name the method, the input and the offending index, and change no state; indices
provably in range are not checked at all."""

import copy

import pytest
import runtimes
import torch

from etmlx.runtime_shim.errors import IndexRangeError
from ruletest import Fn, delegated


class Embed(torch.nn.Module):
    """Token ids -> embeddings -> a linear layer, counting its calls in a buffer."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, ids):
        self.calls.add_(1)
        return self.head(self.embed(ids)) + self.calls


def _raises_like_eager(module, args, match):
    with pytest.raises((IndexError, RuntimeError)):  # gather raises RuntimeError in PyTorch
        module(*args)
    return pytest.raises(IndexRangeError, match=match)


@pytest.mark.parametrize("bad", [10, -1, -11, 10**9])
def test_token_ids_out_of_range(bad):
    lowered = delegated(Embed(), (torch.tensor([[1, 2, 3]]),), nodes=["CheckIndex", "Take"])
    ids = torch.tensor([[1, bad, 3]])
    match = rf"^forward: input 'ids' holds index {bad}, out of range for a dimension of size 10 \(valid: 0 to 9\)$"
    with _raises_like_eager(Embed(), (ids,), match):
        lowered.program.forward(ids)


def test_a_failed_call_changes_no_state():
    module = Embed()
    eager = copy.deepcopy(module).eval()  # before export's parity check counts a call
    lowered = delegated(module, (torch.tensor([[1, 2, 3]]),))
    program = runtimes.load(lowered.pte)
    good = torch.tensor([[4, 5, 6]])
    first = program.forward(good)
    with pytest.raises(IndexRangeError):
        program.forward(torch.tensor([[4, 50, 6]]))
    with torch.no_grad():
        eager(good)  # the eager model's first call; its failed call never happened either
        torch.testing.assert_close(program.forward(good), eager(good))
    assert not torch.equal(first, program.forward(good))  # the counter still counts


@pytest.mark.parametrize(
    "name, fn, index, match",
    [
        ("index_select", lambda x, i: torch.index_select(x, 1, i), [0, 5], r"holds index 5, .* size 5 \(valid: 0 to 4\)"),
        ("index_select_negative", lambda x, i: torch.index_select(x, 1, i), [0, -1], r"holds index -1, .* \(valid: 0 to 4\)"),
        ("gather", lambda x, i: torch.gather(x, 1, i.expand(3, -1)), [[7]], r"holds index 7, .* size 5"),
        ("advanced", lambda x, i: x[:, i], [2, -6], r"holds index -6, .* size 5 \(valid: -5 to 4\)"),
        ("index_put", lambda x, i: x.index_put((i,), torch.ones(5)), [0, 3], r"holds index 3, .* size 3 \(valid: -3 to 2\)"),
    ],
)
def test_each_indexing_operator(name, fn, index, match):
    x, good = torch.randn(3, 5), torch.tensor([[0]] if name == "gather" else [0, 1])
    lowered = delegated(fn, (x, good), nodes=["CheckIndex"])
    bad = torch.tensor(index)
    with _raises_like_eager(Fn(fn), (x, bad), rf"^forward: .* {match}"):
        lowered.program.forward(x, bad)


def test_negative_indices_keep_their_meaning():
    x = torch.randn(3, 5)
    delegated(lambda x, i: x[:, i], (x, torch.tensor([-1, -5, 4])), nodes=["CheckIndex", "Index"])


def test_indices_provably_in_range_are_not_checked():
    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("order", torch.tensor([2, 0, 1]))

        def forward(self, x):
            return x[:, self.order], x[:, torch.arange(1, 4)], torch.flip(x, [1])

    lowered = delegated(Fixed(), (torch.randn(2, 4),))
    assert "CheckIndex" not in lowered.nodes


def test_positions_a_sort_returns_are_in_range_by_construction():
    """A router's chosen experts index the experts' weights unchecked: topk over 4
    values returns positions 0 to 3, reshaped or not. Positions from a sort over 5
    values indexing 4 rows are checked."""

    def fn(scores, weights, more):
        chosen = torch.topk(scores, 2).indices
        ranked = torch.sort(scores, dim=0).indices
        return weights[chosen.reshape(-1)], more[ranked.T], weights[ranked[:2, 0]]

    scores = torch.randn(5, 4)
    scores[:, 0] = torch.tensor([4.0, 3, 0, 1, 2])  # the two lowest at rows 2 and 3
    lowered = delegated(fn, (scores, torch.randn(4, 6), torch.randn(5, 6)))
    assert lowered.nodes.count("CheckIndex") == 1


def test_a_constant_index_out_of_range_is_still_checked():
    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("order", torch.tensor([0, 9]))

        def forward(self, x):
            return x[:, self.order]

    from lowering_harness import lower

    lowered = lower(Broken(), (torch.randn(2, 4),))
    assert "CheckIndex" in lowered.nodes
    with pytest.raises(IndexRangeError, match="holds index 9"):
        lowered.program.forward(torch.randn(2, 4))


def test_indices_computed_from_nan_raise_and_read_nothing_out_of_bounds():
    """Indices computed in the graph from a float input: a NaN there is an out-of-range
    index (PyTorch makes it INT64_MIN), never a read out of bounds, also under mx.compile,
    which fuses the cast into generated code where it is undefined."""

    class Bucketed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)

        def forward(self, x):
            return self.embed((x * 4).long())

    lowered = delegated(Bucketed(), (torch.rand(5),), nodes=["CheckIndex"])
    x = torch.rand(5)
    x[2] = float("nan")
    with pytest.raises(IndexRangeError, match="an index computed from input 'x'"):
        lowered.program.forward(x)


def test_one_check_per_indices_and_bound():
    """Every layer's KV cache is written at the same position: checked once per size."""

    class Caches(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, length in (("k", 6), ("v", 6), ("w", 4)):
                self.register_buffer(name, torch.zeros(length, 2))

        def forward(self, position, x):
            self.k[position] = x
            self.v[position] = x
            self.w[position] = x
            return self.k + self.v, self.w.clone()

    x = torch.ones(1, 2)
    lowered = delegated(Caches(), (torch.tensor([1]), x))
    assert lowered.nodes.count("CheckIndex") == 2
    with _raises_like_eager(Caches(), (torch.tensor([5]), x), r"holds index 5, out of range for a dimension of size 4"):
        lowered.program.forward(torch.tensor([5]), x)


def test_strided_indices_report_the_first_bad_one_in_their_own_order():
    """Indices the graph transposes are a strided view: the host-side check walks them
    in row-major order (9 comes first there, 7 first in memory)."""
    fn = lambda x, i: x[:, i.t()]  # noqa: E731
    x = torch.randn(3, 5)
    lowered = delegated(fn, (x, torch.tensor([[0, 1, 2], [3, 4, 0]])), nodes=["CheckIndex", "Transpose"])
    bad = torch.tensor([[0, 1, 7], [9, 2, 3]])
    with _raises_like_eager(Fn(fn), (x, bad), r"holds index 9, out of range for a dimension of size 5"):
        lowered.program.forward(x, bad)
