"""Parity of the rules along one axis: running sums, sorted values, top-k values."""

import pytest
import torch
from lowering_harness import assert_close, lower
from ruletest import Fn, delegated, untested_rules

from etmlx.errors import ExportError


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_cumsum(dtype):
    x = (torch.randn(3, 6) * 2).to(dtype)
    delegated(lambda x: (torch.cumsum(x, -1), torch.cumsum(x, 0)), (x,), nodes=["CumSum"])


def _with_ties_and_nan(dtype):
    x = torch.tensor([[3, 1, 3, -2, 0, 1], [0, 3, -2, 1, 1, 7]]).to(dtype)
    if dtype.is_floating_point:
        x[1, 2], x[0, 5] = float("nan"), float("inf")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_sorted_and_top_values(dtype):
    """Ties and NaN (last ascending, first descending, as in PyTorch)."""
    x = _with_ties_and_nan(dtype)

    def fn(x):
        return (
            torch.sort(x).values, torch.sort(x, dim=0, descending=True)[0],
            torch.topk(x, 3).values, torch.topk(x, 2, dim=0, largest=False)[0],
        )

    delegated(fn, (x,), nodes=["Sort"])


def _sorts_and_tops(x):
    return (
        *torch.sort(x), *torch.sort(x, dim=0, descending=True),
        *torch.topk(x, 3), *torch.topk(x, 2, dim=0, largest=False),
        torch.topk(x, 1).indices, torch.sort(x, descending=True).indices,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8], ids=str)
def test_indices_of_distinct_values_are_pytorchs(dtype):
    """Without ties the order is the values' own: indices equal eager's exactly."""
    torch.manual_seed(0)
    x = torch.randperm(5 * 37).reshape(5, 37).to(dtype)  # 0 to 184: exact in every dtype here
    delegated(_sorts_and_tops, (x,), nodes=["ArgSort", "TakeAlongAxis"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_tied_values_come_lowest_index_first(dtype):
    """PyTorch leaves the order of tied values' indices unspecified (its CPU kernel on
    Linux gives ``[5, 2, 0]`` for the float top 3 of row 0 here); etmlx takes the lowest
    index first in both directions, as PyTorch's stable sort does. NaN ranks highest."""
    x = _with_ties_and_nan(dtype)
    lowered = lower(Fn(_sorts_and_tops), (x,))
    assert lowered.kernels == [] and "ArgSort" in lowered.nodes
    got = lowered.program.forward(x)
    stable = {d: torch.sort(x, dim=dim, descending=d, stable=True) for d, dim in ((False, -1), (True, 0))}
    expected = (
        *stable[False], *stable[True],
        *(t[:, :3] for t in torch.sort(x, descending=True, stable=True)),
        *(t[:2] for t in torch.sort(x, dim=0, stable=True)),
        torch.sort(x, descending=True, stable=True).indices[:, :1], torch.sort(x, descending=True, stable=True).indices,
    )
    assert_close(got, expected)
    eager = _sorts_and_tops(x)
    for output in (0, 2, 4, 6):  # the values do not depend on the order of ties
        assert_close(got[output], eager[output])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_stable_sorts_are_exact(dtype):
    """``stable=True`` orders ties by index, which is etmlx's rule for every sort: such
    calls (not core ATen, so ExecuTorch refuses them) are taken whole."""
    x = _with_ties_and_nan(dtype)

    def fn(x):
        return (
            *torch.sort(x, stable=True), *torch.sort(x, dim=0, descending=True, stable=True),
            torch.argsort(x, stable=True), torch.argsort(x, dim=-1, descending=True, stable=True),
        )

    delegated(fn, (x,), nodes=["ArgSort"])


def test_a_stable_sort_mlx_declines_is_one_clear_error():
    with pytest.raises(ExportError, match=r"aten.sort.stable is not in Core ATen.*MLX declined it .*float64"):
        lower(Fn(lambda x: torch.sort(x, stable=True).indices), (torch.randn(3, 4, dtype=torch.float64),))


def test_every_scan_rule_is_tested(whole_file):
    assert untested_rules("scan") == set()
