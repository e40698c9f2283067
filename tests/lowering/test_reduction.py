"""Parity of the reduction rules: sums, means, extrema, any/all, arg-reductions."""

import pytest
import torch
from ruletest import delegated, dtype_shape_cases, lowered_directly, untested_rules

aten = torch.ops.aten


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(4, 6), (2, 3, 5), (7,)]))
def test_float_reductions(dtype, shape):
    x = torch.randn(shape, dtype=dtype)

    def fn(x):
        return (
            x.sum(-1),
            x.sum(0, keepdim=True),
            x.sum(),
            x.mean(-1, keepdim=True),
            x.mean(),
            x.amax(-1),
            x.amin(0, keepdim=True),
            (x.abs() + 0.5).prod(-1),
            x.max(-1).values,
            x.min(0, keepdim=True)[0],
            x.argmax(-1),
            x.argmin(0, keepdim=True),
        )

    lowered = delegated(fn, (x,), nodes=["Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin"])
    assert "AsType" in lowered.nodes  # MLX arg-reductions are uint32; PyTorch's int64


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=str)
def test_integer_and_bool_reductions(dtype):
    """PyTorch sums integers and bools in int64; a bool mean needs a float first."""
    x = torch.randint(-100, 100, (3, 5)).to(dtype)

    def fn(x):
        return x.sum(), x.sum(1), x.sum(0, keepdim=True), x.float().mean(1), x.amax(0), x.int().argmax(1)

    lowered = delegated(fn, (x,), nodes=["Sum", "Mean", "Max", "ArgMax"])
    assert all(out.dtype == torch.int64 for out in lowered.program.forward(x)[:3])


def test_int32_sum_overflowing_int32_is_exact():
    x = torch.full((4, 3), 2**30, dtype=torch.int32)
    delegated(lambda x: (x.sum(), x.sum(0)), (x,), nodes=["Sum"])


@pytest.mark.parametrize("shape", [(2, 3, 4)], ids=str)
def test_any_all(shape):
    x = torch.randint(-1, 2, shape)

    def fn(x):
        positive = x > 0
        return positive.any(), positive.all(-1), positive.any(dim=(0, 1)), torch.any(positive, dim=0), x.bool().all()

    delegated(fn, (x,), nodes=["Any", "LogicalNot"])  # edge writes all() as not(any(not))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
def test_whole_tensor_extrema_and_indices(dtype):
    """Ties resolve to the first index and NaN wins, in both."""
    x = torch.tensor([[3, 1, 3, -2], [0, 3, -2, 1], [3, 0, 0, 1]]).to(dtype)
    inputs = [(x,)]
    if dtype.is_floating_point:
        with_nan = x.clone()
        with_nan[1, 2] = float("nan")
        inputs.append((with_nan,))

    def fn(x):
        return (
            x.max(), x.min(), x.argmax(), x.argmin(), x.argmax(keepdim=True),
            *x.max(1), *x.min(0, keepdim=True), x.max(1).indices,
        )

    for args in inputs:
        delegated(fn, args, nodes=["Max", "Min", "ArgMax", "ArgMin"])


def test_whole_tensor_product_and_var_dim():
    x = torch.randn(3, 4) * 0.5 + 1
    delegated(lambda x: (x.prod(), x.int().prod()), (x,), nodes=["Prod"])
    var_dim = lambda x: (aten.var.dim(x, [1], False, True), aten.var.dim(x, None))  # noqa: E731
    assert "Variance" in lowered_directly(var_dim, (x,))


def test_rules_that_edge_decomposes_lowered_directly():
    x = torch.randn(3, 4)
    i = torch.randint(-9, 9, (3, 4), dtype=torch.int32)
    assert lowered_directly(lambda x: aten.sum.default(x), (x,)) == ["Sum"]
    assert lowered_directly(lambda i: aten.sum.default(i), (i,)) == ["AsType", "Sum"]  # int64, as PyTorch
    assert "All" in lowered_directly(lambda x: (aten.all.dim(x > 0, 1), aten.all.dims(x > 0, [0, 1]), aten.all.default(x > 0)), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_var_and_std(dtype):
    x = (torch.randn(3, 5, 6) + 2).to(dtype)
    fn = lambda x: (x.var(-1), x.var((0, 2), keepdim=True), x.var(1, correction=0), x.std(-1), torch.var(x))  # noqa: E731
    delegated(fn, (x,), nodes=["Variance"])


def test_every_reduction_rule_is_tested(whole_file):
    assert untested_rules("reduction") == set()
