"""Parity of the normalization rules: softmax, log-softmax, layer norm, batch norm (eval)."""

import pytest
import torch
from ruletest import declined, delegated, dtype_shape_cases, untested_rules


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(4, 10), (2, 3, 7), (5,)]))
def test_softmax_and_log_softmax(dtype, shape):
    x = (torch.randn(shape) * 4).to(dtype)
    fn = lambda x: (x.softmax(-1), x.softmax(0), x.log_softmax(-1), torch.log_softmax(x, 0))  # noqa: E731
    delegated(fn, (x,), exact=["Softmax", "Softmax", "LogSoftmax", "LogSoftmax"])


def test_softmax_of_half_into_float():
    x = torch.randn(3, 8, dtype=torch.float16)
    delegated(lambda x: torch.softmax(x, -1, dtype=torch.float32), (x,), exact=["AsType", "Softmax"])


@pytest.mark.parametrize(
    "dtype,shape,affine",
    [(torch.float32, (2, 5, 16), True), (torch.float16, (3, 8), False), (torch.bfloat16, (2, 5, 16), True)],
    ids=["f32-affine", "f16-plain", "bf16-affine"],
)
def test_layer_norm(dtype, shape, affine):
    norm = torch.nn.LayerNorm(shape[-1], elementwise_affine=affine, eps=1e-4)
    if affine:
        with torch.no_grad():
            norm.weight.normal_()
            norm.bias.normal_()
    x = (torch.randn(shape) * 3 + 1).to(dtype)
    delegated(norm.to(dtype), (x,), exact=["LayerNorm"])


def test_layer_norm_weight_without_bias():
    norm = torch.nn.LayerNorm(8, bias=False)
    with torch.no_grad():
        norm.weight.normal_()
    delegated(norm, (torch.randn(2, 8),), exact=["LayerNorm"])


def test_layer_norm_over_two_dims_is_declined_but_correct():
    reason = declined(torch.nn.LayerNorm([3, 4]), (torch.randn(2, 3, 4),), "aten::native_layer_norm")
    assert "trailing dims" in reason


def _trained(norm):
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.0)
    return norm.eval()


@pytest.mark.parametrize(
    "norm,shape,dtype",
    [
        (torch.nn.BatchNorm1d(4), (3, 4, 6), torch.float16),  # rank 3: (N, C, L)
        (torch.nn.BatchNorm2d(3), (2, 3, 5, 5), torch.float32),
        (torch.nn.BatchNorm2d(3, affine=False), (2, 3, 4, 4), torch.bfloat16),
    ],
    ids=["1d-f16", "2d-f32", "2d-plain-bf16"],
)
def test_batch_norm_eval(norm, shape, dtype):
    norm = _trained(norm) if norm.affine else norm.eval()
    if not norm.affine:
        with torch.no_grad():
            norm.running_mean.normal_()
            norm.running_var.uniform_(0.5, 2.0)
    delegated(norm.to(dtype), (torch.randn(shape, dtype=dtype),), exact=["Mul", "Add"])


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(2, 6, 5), (1, 6, 4, 4), (2, 6, 2, 3, 2)]))
def test_group_norm(dtype, shape):
    affine = torch.nn.GroupNorm(3, 6).to(dtype)
    with torch.no_grad():
        affine.weight.uniform_(0.5, 1.5)
        affine.bias.uniform_(-0.5, 0.5)
    plain = torch.nn.GroupNorm(2, 6, affine=False).to(dtype)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.affine, self.plain = affine, plain

        def forward(self, x):
            return self.affine(x), self.plain(x * 3 + 1)

    delegated(M(), (torch.randn(shape).to(dtype),), nodes=["Variance", "Rsqrt"])


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(2, 6, 5), (2, 6, 4, 4), (1, 6, 2, 3, 2)]))
def test_instance_norm_and_batch_norm_by_batch_statistics(dtype, shape):
    """InstanceNorm (1-3d, affine or not) and a BatchNorm without running statistics
    normalize by the input's own statistics."""
    instance = getattr(torch.nn, f"InstanceNorm{len(shape) - 2}d")
    affine, plain = instance(6, affine=True).to(dtype), instance(6).to(dtype)
    batch = getattr(torch.nn, f"BatchNorm{len(shape) - 2}d")(6, track_running_stats=False).to(dtype)
    with torch.no_grad():
        for norm in (affine, batch):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.affine, self.plain, self.batch = affine, plain, batch

        def forward(self, x):
            return self.affine(x), self.plain(x * 3 + 1), self.batch(x - 2)

    delegated(M().eval(), (torch.randn(shape).to(dtype),), nodes=["Variance", "Rsqrt"])


def test_every_normalization_rule_is_tested(whole_file):
    assert untested_rules("normalization") == set()
