"""Parity of the rules along one axis: running sums, sorted values, top-k values."""

import pytest
import torch
from ruletest import declined, delegated, untested_rules


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


def test_indices_of_tied_values_stay_with_pytorch():
    x = _with_ties_and_nan(torch.float32)
    reason = declined(lambda x: torch.topk(x, 3).indices, (x,), "aten::topk")
    assert "tied values" in reason


def test_every_scan_rule_is_tested(whole_file):
    assert untested_rules("scan") == set()
