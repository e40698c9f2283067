"""``torch.bucketize`` against eager PyTorch: values below, between, on and above the
boundaries, NaN and infinities, both sides; declined where the boundaries may not ascend."""

import math

import pytest
import torch
from lowering_harness import Fn, lower
from ruletest import delegated, untested_rules

from etmlx.errors import ExportError


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_bucketize_over_a_range(right, out_int32):
    values = torch.tensor([[-1.0, 0.0, 0.25, 0.2501, 0.5, 0.99, 1.0, 7.0],
                           [math.nan, math.inf, -math.inf, 0.75, 0.7499, 0.1, 0.3, 0.6]])

    def fn(x):
        return torch.bucketize(x, torch.arange(0.25, 1.0, 0.25), right=right, out_int32=out_int32)

    delegated(fn, (values,), nodes=["Greater" if right else "GreaterEqual", "Sum"])


def test_bucketize_over_boundaries_that_may_not_ascend_is_declined():
    """Boundaries given at run time may come unsorted, where PyTorch's search and MLX's
    count differ; ExecuTorch has no kernel for the operator either, so the export fails
    with the reason."""
    with pytest.raises(ExportError, match="bucketize over boundaries not known to ascend"):
        lower(Fn(lambda x, b: torch.bucketize(x, b)).eval(), (torch.rand(5), torch.tensor([0.5, 0.2, 0.9])))


def test_every_rule_is_tested():
    assert untested_rules("search") == set()
