"""gather, advanced indexing, index_put, copy and running reductions."""

import pytest
import runtimes
import torch
from torch.export import Dim

from ruletest import delegated, lowered_directly, untested_rules

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_gather(dtype):
    x = torch.randn(3, 5).to(dtype)
    index = torch.randint(0, 5, (3, 4))
    delegated(lambda x, i: (torch.gather(x, 1, i), torch.gather(x, 0, i[:2, :3] % 3)), (x, index), nodes=["TakeAlongAxis"])


def test_index_with_broadcast_index_tensors():
    """The pattern transformers' mask code emits: x[batch_idx, position_idx]."""
    x = torch.randn(2, 8)
    batch = torch.arange(2).view(2, 1, 1, 1)
    positions = torch.arange(8).view(1, 1, 8, 1)
    delegated(lambda x, b, p: x[b, p], (x, batch, positions), exact=["CheckIndex", "CheckIndex", "Index"])


@pytest.mark.parametrize("key", ["middle", "separated", "negative"])
def test_index_placement_rules(key):
    x = torch.randn(4, 5, 6)
    i = torch.tensor([[0, 3], [2, 1]])
    j = torch.tensor([1, 4])
    fns = {
        "middle": lambda x, i, j: x[:, i],  # index shape lands at dim 1
        "separated": lambda x, i, j: x[i, :, j],  # separated: broadcast index shape goes first
        "negative": lambda x, i, j: x[:, -j],  # negative indices wrap, as in PyTorch
    }
    delegated(fns[key], (x, i, j), nodes=["Index"])


def test_index_with_bool_mask_is_declined():
    from ruletest import declined

    declined(lambda x, m: x[m], (torch.randn(5), torch.tensor([True, False, True, True, False])), "aten::index.Tensor")


class Cache(torch.nn.Module):
    """A static cache written at run-time positions, as KV caches are."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, 8, 4))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, values, positions):
        self.cache[:, :, positions] = values
        self.count.copy_(self.count + positions.numel())
        return self.cache * 1, self.count + 0


def test_index_put_and_copy_update_buffers_across_calls():
    eager = Cache()
    lowered = delegated(Cache(), (torch.randn(1, 2, 2, 4), torch.tensor([6, 7])), nodes=["IndexPut"])
    program = runtimes.load(lowered.pte)  # fresh state: check_parity ran the first one
    for positions in ([0, 1], [4, 2], [1, 7]):
        args = (torch.randn(1, 2, len(positions), 4), torch.tensor(positions))
        actual, expected = program.forward(*args), eager(*args)
        torch.testing.assert_close(actual[0], expected[0])
        assert int(actual[1]) == int(expected[1])


def test_index_put_accumulate():
    x = torch.randn(5, 3)
    index = torch.tensor([0, 2, 2])
    values = torch.randn(3, 3)
    delegated(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), (x, index, values), nodes=["IndexPut"])


@pytest.mark.parametrize("weight_dtype,index_dtype", [(torch.float16, torch.int32), (torch.bfloat16, torch.int64)], ids=str)
def test_embedding_and_index_select(weight_dtype, index_dtype):
    embedding = torch.nn.Embedding(10, 4).to(weight_dtype)
    x = torch.randn(3, 6, 7, dtype=weight_dtype)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = embedding

        def forward(self, tokens, index):
            return self.embedding(tokens), x.index_select(1, index), torch.index_select(x, -1, index[:1])

    tokens = torch.tensor([[1, 9, 0], [4, 4, 7]], dtype=index_dtype)
    index = torch.tensor([5, 0, 2, 2], dtype=index_dtype)
    delegated(M(), (tokens, index), nodes=["Take"])


def test_copy_casts_and_broadcasts_the_source():
    x, row = torch.zeros(3, 4), torch.arange(4, dtype=torch.int32)
    assert lowered_directly(lambda x, r: aten.copy.default(x, r), (x, row)) == ["AsType", "BroadcastTo"]
    assert lowered_directly(lambda x, y: aten.copy.default(x, y), (x, torch.randn(3, 4))) == []


def test_a_copy_into_a_dynamic_shape_from_the_same_shape():
    """Qwen3.5's rotary sections: columns of a tensor as long as the call written in place."""
    def fn(x):
        out = torch.zeros(x.shape[0], 4)
        out[:, 1:3] = x[:, :2] * 2
        return out

    seq = Dim("seq", min=2, max=16)
    delegated(fn, (torch.randn(5, 3),), dynamic_shapes=({0: seq},), run_with=[(torch.randn(9, 3),)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_slice_and_select_scatter(dtype):
    x, src = torch.zeros(3, 6, 2, dtype=dtype), torch.arange(3 * 2 * 2).reshape(3, 2, 2).to(dtype)

    def fn(x, src):
        return (
            torch.slice_scatter(x, src, dim=1, start=1, end=5, step=2), torch.slice_scatter(x, src, 1, -2),
            torch.select_scatter(x, src[:, 0], 1, -1), torch.select_scatter(x, src[0].repeat(3, 1), 0, 2),
        )

    delegated(fn, (x, src), nodes=["IndexPut"])
    select = lambda x, src: torch.ops.aten.select_scatter.default(x, src[:, 0], 1, -1)  # noqa: E731  (edge decomposes it)
    assert "IndexPut" in lowered_directly(select, (x, src))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_scatter_add(dtype):
    """Duplicate positions accumulate; the index may cover less than src and self."""
    x = torch.arange(4 * 5, dtype=dtype).reshape(4, 5)
    src = torch.arange(3 * 6, dtype=dtype).reshape(3, 6) * 3

    def fn(x, index, src):
        return x.scatter_add(1, index, src), x.scatter_add(0, index[:, :2] % 4, src)

    index = torch.tensor([[0, 4, 4], [1, 1, 1], [3, 2, 0]])
    lowered = delegated(fn, (x, index, src), nodes=["IndexPut", "CheckIndex"])
    with pytest.raises(IndexError, match="holds index 5"):
        lowered.program.forward(x, index + (index == 4), src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_scatter_value(dtype):
    """Repeated positions included: every write there is the same value."""
    x = (torch.arange(4 * 5).reshape(4, 5) % 3).to(dtype)

    def fn(x, index):
        return x.scatter(1, index, 1), x.scatter(0, index[:, :2] % 4, -2.5 if dtype.is_floating_point else 0)

    index = torch.tensor([[0, 4, 4], [1, 1, 1], [3, 2, 0]])
    lowered = delegated(fn, (x, index), nodes=["IndexPut", "CheckIndex"])
    with pytest.raises(IndexError, match="holds index 5"):
        lowered.program.forward(x, index + (index == 4))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_scatter_reduce(reduce, dtype):
    """With and without self's own elements, repeated positions, an index smaller than
    src, and (floats) NaNs in self and in src, which PyTorch's max and min propagate."""
    x = (torch.arange(4 * 5).reshape(4, 5) % 7 - 3).to(dtype)
    src = (torch.arange(3 * 6).reshape(3, 6) % 5 - 2).to(dtype)
    if dtype.is_floating_point:
        x[0, 1], src[1, 0] = float("nan"), float("nan")  # src[1, 0] lands on x[1, 1]

    def fn(x, index, src):
        return (x.scatter_reduce(1, index, src, reduce), x.scatter_reduce(1, index, src, reduce, include_self=False),
                x.scatter_reduce(0, index[:, :2] % 4, src, reduce, include_self=False))

    index = torch.tensor([[0, 1, 1], [1, 1, 1], [3, 2, 0]])
    lowered = delegated(fn, (x, index, src), nodes=["IndexPut"])
    with pytest.raises(IndexError, match="holds index 5"):
        lowered.program.forward(x, index + 4 * (index == 1), src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_masked_scatter(dtype):
    """As a vision-language model splices image features into its token embeddings; a
    mask broadcast over rows; a source larger than needed; one too small fails by name."""
    x = torch.arange(4 * 5, dtype=torch.float32).reshape(4, 5).to(dtype)
    source = (torch.arange(3 * 5, dtype=torch.float32).reshape(3, 5) * -1).to(dtype)

    def fn(x, mask, row_mask, source):
        return x.masked_scatter(mask, source), x.masked_scatter(row_mask, source)

    mask = torch.tensor([[True, False, True, True, False], [False] * 5, [True, True, False, False, True], [False] * 5])
    row_mask = torch.tensor([[True], [False], [True], [False]])
    lowered = delegated(fn, (x, mask, row_mask, source), nodes=["CumSum", "CheckIndex", "Take"])
    with pytest.raises(IndexError, match="masked_scatter's count of true elements of input '.*' holds index 15"):
        lowered.program.forward(x, torch.ones(4, 5, dtype=torch.bool), row_mask, source)


def test_every_indexing_rule_is_tested(whole_file):
    assert untested_rules("indexing") == set()
