"""Parity of the size rules: sym_size and integer arithmetic on dynamic sizes."""

import torch
from torch.export import Dim
from ruletest import delegated, untested_rules


def test_sym_size_arithmetic():
    batch, seq = Dim("batch", min=2, max=8), Dim("seq", min=4, max=64)

    def fn(x):
        b, n, d = x.shape
        return (
            x.reshape(b * n, d),
            x.new_full((n + 1,), 2.0),
            x.new_full((n - 1, b), 3.0),
            x.new_full((n // 2,), 4.0),
            x.new_full((n % 3 + 2, 2), 5.0),  # sizes stay >= 2: export specializes 0 and 1,
            torch.cat([x, x], 1)[:, -n:],  # the last n: a slice from -n
        )

    x = torch.randn(2, 6, 4)
    delegated(
        fn, (x,), dynamic_shapes=({0: batch, 1: seq},),
        run_with=[(torch.randn(3, 7, 4),), (torch.randn(5, 4, 4),)],
        nodes=["SymSize", "Add", "Sub", "Mul", "FloorDivide", "Mod"],
    )


def test_every_sizes_rule_is_tested(whole_file):
    assert untested_rules("sizes") == set()
