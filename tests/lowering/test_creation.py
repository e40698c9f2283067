"""Parity of the creation rules: full, full_like, scalar_tensor, arange, random_uniform."""

import pytest
import torch
from torch.export import Dim
from ruletest import declined, delegated, lowered_directly, untested_rules


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool]


def test_full_and_full_like_in_every_dtype():
    def fn(x):
        outputs = []
        for dtype in DTYPES:
            like = x.to(dtype)
            outputs += [
                torch.full((2, 3), 1, dtype=dtype),
                torch.full_like(like, 0),
                torch.ones_like(like),
                torch.full((1, 3), -2 if dtype != torch.bool else True, dtype=dtype),
            ]
        return outputs

    lowered = delegated(fn, (torch.randn(2, 3),))
    assert lowered.nodes.count("Full") == 4 * len(DTYPES)


def test_full_fills_after_a_computation_and_scalar_tensor():
    x = torch.randn(3, dtype=torch.float16)
    delegated(lambda x: (x + torch.full((3,), 2.5, dtype=torch.float16), torch.where(x > 0, x, -1.5)), (x,), nodes=["Full", "Where"])


def test_int64_constants_beyond_float_precision_stay_exact():
    """2**60 + 1 is not a float64: fills and scalar operands carry integers as int64."""
    big = 2**60 + 1
    x = torch.tensor([1, -2, 3], dtype=torch.int64)
    lowered = delegated(lambda x: (torch.full((2,), big), x + big, x * (big // 8)), (x,), nodes=["Full", "Add", "Mul"])
    (full, added, multiplied) = lowered.program.forward(x)
    assert full.tolist() == [big, big] and added.tolist() == [big + 1, big - 2, big + 3]


def test_full_like_of_a_dynamic_shape():
    seq = Dim("seq", min=2, max=16)
    delegated(
        lambda x: torch.full_like(x, 7) + x, (torch.randn(2, 5),), nodes=["Full", "SymSize"],
        dynamic_shapes=({1: seq},), run_with=[(torch.randn(2, 9),), (torch.randn(2, 16),)],
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_fill(dtype):
    x = torch.zeros(2, 3, dtype=dtype)
    assert lowered_directly(lambda x: torch.ops.aten.fill.Scalar(x, 7) + x, (x,))[0] == "Full"


def test_arange():
    """Known bounds make constants, computed by PyTorch (float steps included)."""
    def fn(x):
        outputs = []
        for dtype in (torch.int64, torch.int32, torch.float32, torch.float16):
            outputs += [torch.arange(5, dtype=dtype) + x.to(dtype), torch.arange(1, 9, 3, dtype=dtype), torch.arange(-4, 4, 2, dtype=dtype)]
        return outputs + [torch.arange(0.5, 5) + x, torch.arange(0, 1, 4 / 24) * x[0]]

    lowered = delegated(fn, (torch.ones(5, dtype=torch.int64),))
    assert "Arange" not in lowered.nodes


def test_arange_of_a_dynamic_size():
    seq = Dim("seq", min=2, max=64)

    def fn(x):
        return x + torch.arange(x.shape[0]), torch.arange(1, x.shape[0] + 1) * 2

    delegated(
        fn, (torch.ones(5, dtype=torch.int64),), dynamic_shapes=({0: seq},),
        run_with=[(torch.ones(9, dtype=torch.int64),), (torch.ones(2, dtype=torch.int64),)],
        nodes=["Arange", "SymSize"],
    )


def test_arange_of_a_dynamic_step_is_declined_but_correct():
    seq = Dim("seq", min=2, max=32)
    reason = declined(lambda x: torch.arange(0, 64, x.shape[0]) * 2, (torch.randn(4),), "aten::arange.start_step",
                      dynamic_shapes=({0: seq},))
    assert "dynamic step" in reason


def test_random_uniform_draws_mlx_numbers_keyed_by_the_seed():
    """The eager kernel asks MLX for ``mx.random.uniform(key=mx.random.key(seed))``; the
    graph builds that key from the seed tensor, for seeds past 32 bits and negative."""
    import etmlx.lowering.custom_ops  # noqa: F401  (registers torch.ops.etmlx.*)

    def fn(seed, x):
        return torch.ops.etmlx.random_uniform(seed, [x.shape[0], 5])

    seeds = [torch.tensor(s) for s in (0, 2**40 + 3, -7)]
    lowered = delegated(fn, (seeds[0], torch.ones(3)), nodes=["RandomUniform"], dynamic_shapes=(None, {0: Dim("rows", max=64)}),
                        run_with=[(seed, torch.ones(rows)) for seed, rows in zip(seeds[1:], (4, 1))])
    first, other = (lowered.program.forward(torch.tensor(s), torch.ones(3)) for s in (1, 2))
    assert 0 <= first.min() and first.max() < 1 and not torch.equal(first, other)


def test_every_creation_rule_is_tested(whole_file):
    assert untested_rules("creation") == set()
