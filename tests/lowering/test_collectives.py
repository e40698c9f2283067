"""etmlx::all_sum in a process group of one, where the sum across ranks is the value
itself (tests/distributed runs it across ranks)."""

import torch
from ruletest import Fn, delegated, untested_rules

import etmlx.lowering.custom_ops  # noqa: F401  (registers torch.ops.etmlx.all_sum)


def test_all_sum_of_a_row_parallel_product():
    weight = torch.randn(8, 16)
    lowered = delegated(Fn(lambda x: torch.ops.etmlx.all_sum(x @ weight.T) + 1), [torch.randn(3, 16)], nodes=["AllSum"])
    assert lowered.nodes.count("AllSum") == 1


def test_every_collectives_rule_is_tested(whole_file):
    assert untested_rules("collectives") == set()
