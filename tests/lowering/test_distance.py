"""``torch.cdist`` and ``torch.pdist`` against eager PyTorch: every p PyTorch computes directly, batched and
broadcast point sets, pairs at distance 0; the matrix-multiply form PyTorch uses for p=2
on many points."""

import math

import pytest
import torch
from ruletest import declined_reason, delegated, untested_rules


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, 0.5, math.inf])
def test_cdist(p):
    x1, x2 = torch.randn(2, 5, 4), torch.randn(2, 7, 4)
    x1[0, 1] = x2[0, 3]  # one pair at distance 0
    x2[1, 2, 0] = x1[1, 0, 0]  # and one equal coordinate

    def fn(x1, x2, single):
        return torch.cdist(x1, x2, p=p), torch.cdist(single, x2, p=p)

    delegated(fn, (x1, x2, torch.randn(1, 3, 4)), nodes=["ExpandDims", "Sub"])


def test_cdist_by_matrix_multiply():
    """torch.cdist writes the matrix-multiply form out itself (matmul, clamp, sqrt: all on
    MLX); called as that form, the operator is declined with the reason."""
    points, others = torch.randn(30, 3), torch.randn(8, 3)
    delegated(lambda a, b: torch.cdist(a, b), (points, others), nodes=["Matmul"])
    reason = declined_reason(lambda a, b: torch.ops.aten._cdist_forward(a, b, 2.0, None), (points, others),
                             "aten::_cdist_forward")
    assert "30 points" in reason
    delegated(lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"), (points, others),
              nodes=["Sqrt"])


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, math.inf])
def test_pdist(p):
    points = torch.randn(6, 4)
    points[4] = points[1]  # a pair at distance 0
    delegated(lambda x: torch.pdist(x, p=p), (points,), nodes=["Take"])


def test_every_distance_rule_is_tested(whole_file):
    assert untested_rules("distance") == set()
