"""Parity of the creation rules: full, full_like, scalar_tensor, arange."""

import pytest
import torch
from torch.export import Dim
from ruletest import declined, delegated, untested_rules


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool], ids=str)
def test_full_and_full_like(dtype):
    x = torch.randn(2, 3).to(dtype)

    def fn(x):
        return (
            torch.full((2, 3), 1, dtype=dtype),
            torch.full_like(x, 0),
            torch.ones_like(x),
            torch.zeros(4, dtype=dtype),
            torch.full((1, 3), -2 if dtype != torch.bool else True, dtype=dtype),
        )

    delegated(fn, (x,), exact=["Full"] * 5)


def test_full_fills_after_a_computation_and_scalar_tensor():
    x = torch.randn(3, dtype=torch.float16)
    delegated(lambda x: (x + torch.full((3,), 2.5, dtype=torch.float16), torch.where(x > 0, x, -1.5)), (x,), nodes=["Full", "Where"])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32], ids=str)
def test_arange(dtype):
    def fn(x):
        return torch.arange(5, dtype=dtype) + x, torch.arange(1, 9, 3, dtype=dtype), torch.arange(-4, 4, 2, dtype=dtype)

    delegated(fn, (torch.ones(5, dtype=dtype),), nodes=["Arange"])


def test_arange_of_a_dynamic_size():
    seq = Dim("seq", min=2, max=64)

    def fn(x):
        return x + torch.arange(x.shape[0]), torch.arange(1, x.shape[0] + 1) * 2

    delegated(
        fn, (torch.ones(5, dtype=torch.int64),), dynamic_shapes=({0: seq},),
        run_with=[(torch.ones(9, dtype=torch.int64),), (torch.ones(2, dtype=torch.int64),)],
        nodes=["Arange", "SymSize"],
    )


def test_float_arange_is_declined_but_correct():
    reason = declined(lambda x: x + torch.arange(0.0, 1.0, 0.25), (torch.randn(4),), "aten::arange.start_step")
    assert "non-integer" in reason


def test_every_creation_rule_is_tested(whole_file):
    assert untested_rules("creation") == set()
