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


def _fully_decaying(operands):
    """A step whose decay is 0 (its log -inf), which the CPU's chunked form must take."""
    gamma = operands[3].clone()
    gamma[:, 10] = 0.0
    return operands[:3] + (gamma,) + operands[4:]


STEPS = Dim("steps", min=1, max=160)


def _dynamic(operands):
    return tuple({1: STEPS} if i != 5 else None for i in range(len(operands)))


@pytest.mark.parametrize("key_heads", [2, 4])
def test_output_and_state_over_a_dynamic_number_of_steps(key_heads):
    operands = _operands(5, key_heads)
    lowered = delegated(_rule, operands, dynamic_shapes=_dynamic(operands), run_with=[_operands(1, key_heads)])
    assert lowered.nodes.count("GatedDelta") == 2


def test_many_steps_on_the_cpu_run_in_chunks_of_64():
    """MLX's CPU runs the rule a token at a time; the runtimes resolve chunks of 64 tokens
    as matrix products instead (two chunks here), a step that decays to 0 included: equal
    to the step-by-step rule to float32's rounding over a chunk."""
    lowered = lower(Fn(_rule), _operands(5), {"args": _dynamic(_operands(5))})
    for operands in (_operands(100), _fully_decaying(_operands(100))):
        with torch.no_grad():
            expected = _rule(*operands)
        for actual, wanted in zip(lowered.program.forward(*operands), expected):
            torch.testing.assert_close(actual, wanted, rtol=1e-4, atol=1e-4)


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


def _scan_operands(steps, channels=6, size=4):
    torch.manual_seed(1)
    x, dt = torch.randn(1, steps, channels), torch.nn.functional.softplus(torch.randn(1, steps, channels))
    a = -torch.rand(channels, size) * 4
    b, c = torch.randn(1, steps, size), torch.randn(1, steps, size)
    return x, dt, a, b, c, torch.randn(1, channels, size)


def _scan(x, dt, a, b, c, state):
    output, final = torch.ops.etmlx.selective_scan(x, dt, a, b, c, state)
    return output * 2, final


def test_the_selective_scan_over_a_dynamic_number_of_steps():
    steps = Dim("steps", min=1, max=32)
    shapes = tuple({1: steps} if x.dim() == 3 and i not in (5,) else None for i, x in enumerate(_scan_operands(5)))
    lowered = delegated(_scan, _scan_operands(5), dynamic_shapes=shapes,
                        run_with=[_scan_operands(1), _scan_operands(17)])
    assert lowered.nodes.count("SelectiveScan") == 2


def test_the_selective_scan_continues_from_its_state():
    """Two calls, the second from the first's state, compute what one call over both does."""
    x, dt, a, b, c, state = _scan_operands(9)
    whole, final = torch.ops.etmlx.selective_scan(x, dt, a, b, c, state)
    first, middle = torch.ops.etmlx.selective_scan(x[:, :4], dt[:, :4], a, b[:, :4], c[:, :4], state)
    second, end = torch.ops.etmlx.selective_scan(x[:, 4:], dt[:, 4:], a, b[:, 4:], c[:, 4:], middle)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)
    torch.testing.assert_close(end, final)


def test_a_selective_scan_of_another_dtype_is_refused_by_name():
    with pytest.raises(ExportError, match="etmlx::selective_scan: operands other than float32"):
        lower(Fn(_scan), tuple(x.half() for x in _scan_operands(3)))


def test_every_linear_attention_rule_is_tested(whole_file):
    assert untested_rules("linear_attention") == set()
