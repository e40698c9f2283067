"""The gated delta rule (``etmlx::gated_delta``) on ``mx.fast.gated_delta_update``:
the output and the state after the last step, equal to the step-by-step recurrence,
for one and many steps and for fewer key heads than value heads."""

import pytest
import torch
from lowering_harness import Fn, lower
from ruletest import delegated, untested_rules
from torch.export import Dim

import etmlx.lowering.custom_ops  # noqa: F401  (registers torch.ops.etmlx.gated_delta)
from etmlx.errors import ExportError


def _operands(steps, key_heads=2, value_heads=4, key_size=8, value_size=4):
    torch.manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(1, steps, key_heads, key_size), dim=-1) for _ in range(2))
    v = torch.randn(1, steps, value_heads, value_size)
    gamma, beta = torch.rand(1, steps, value_heads), torch.rand(1, steps, value_heads)
    return q, k, v, gamma, beta, torch.randn(1, value_heads, value_size, key_size)


def _rule(q, k, v, gamma, beta, state):
    output, final = torch.ops.etmlx.gated_delta(q, k, v, gamma, beta, state)
    return output * 2, final


@pytest.mark.parametrize("key_heads", [2, 4])
def test_output_and_state_over_a_dynamic_number_of_steps(key_heads):
    steps = Dim("steps", min=1, max=32)
    operands = _operands(5, key_heads)
    shapes = tuple({1: steps} if x.dim() != 4 or i < 3 else None for i, x in enumerate(operands))
    lowered = delegated(_rule, operands, dynamic_shapes=shapes,
                        run_with=[_operands(1, key_heads), _operands(17, key_heads)])
    assert lowered.nodes.count("GatedDelta") == 2


def test_only_the_output_is_computed_when_only_it_is_used():
    lowered = delegated(lambda *xs: torch.ops.etmlx.gated_delta(*xs)[0], _operands(3))
    assert lowered.nodes.count("GatedDelta") == 1


@pytest.mark.parametrize("change, reason", [
    (lambda xs: tuple(x.half() for x in xs), "operands other than float32"),
    (lambda xs: _operands(3, key_heads=3, value_heads=4), "4 value heads for 3 key heads"),
])
def test_what_mlx_does_not_compute_is_refused_by_name(change, reason):
    """ExecuTorch has no kernel for etmlx's op: a call MLX declines is an error naming why."""
    with pytest.raises(ExportError, match=f"etmlx::gated_delta: {reason}"):
        lower(Fn(_rule), change(_operands(3)))


def test_every_linear_attention_rule_is_tested(whole_file):
    assert untested_rules("linear_attention") == set()
