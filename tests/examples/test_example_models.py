"""The example models end to end: one MLX delegate, nothing outside, eager parity."""

import pytest
import torch

from examples import models
from lowering_harness import assert_close, lower

STATIC = ["mlp", "cnn", "encoder_block"]


def _as(dtype, module, inputs):
    module = module.to(dtype)
    return module, tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", STATIC)
def test_static(name, dtype):
    module, inputs = _as(dtype, *getattr(models, name)()[:2])
    lowered = lower(module, inputs)
    assert len(lowered.delegates) == 1 and lowered.kernels == []
    assert lowered.report.fully_delegated
    with torch.no_grad():
        expected = module(*inputs)
    # Whole models compound rounding over many ops: compare at the next looser tolerance.
    assert_close(lowered.program.forward(*inputs), expected, dtype=torch.bfloat16 if dtype != torch.float32 else None)


EXPECTED_NODES = {
    "mlp": {"Addmm", "Maximum"},
    "cnn": {"Conv", "Max", "Avg", "Addmm"},
    "encoder_block": {"Take", "LayerNorm", "Matmul", "Softmax", "GeluErf", "Addmm"},
}


@pytest.mark.parametrize("name", STATIC)
def test_serialized_nodes(name):
    module, inputs, _ = getattr(models, name)()
    lowered = lower(module, inputs)
    assert EXPECTED_NODES[name] <= set(lowered.nodes)


@pytest.mark.parametrize(
    "name, other_sizes",
    [("mlp_dynamic_batch", [1, 7, 64]), ("encoder_block_dynamic_seq", [2, 5, 128])],
)
def test_dynamic(name, other_sizes):
    module, inputs, dynamic_shapes = getattr(models, name)()
    lowered = lower(module, inputs, dynamic_shapes)
    assert len(lowered.delegates) == 1 and lowered.kernels == []
    for size in other_sizes:
        if name == "mlp_dynamic_batch":
            args = (torch.randn(size, 64),)
        else:
            args = (torch.randint(0, 256, (2, size)),)
        with torch.no_grad():
            expected = module(*args)
        assert_close(lowered.program.forward(*args), expected)


def test_linear_weight_is_stored_as_pytorch_holds_it():
    module, inputs, _ = models.mlp()
    lowered = lower(module, inputs)
    (delegate,) = lowered.delegates
    shapes = [c["shape"] for c in delegate["constants"]]
    assert [128, 64] in shapes and [64, 128] not in shapes  # fc1.weight is (128, 64) in PyTorch
    assert lowered.nodes.count("Transpose") == 3  # each layer's matmul reads its weight transposed
