"""Inputs at run time, on every runtime: strided, meta, NaN-carrying, empty and oversized
tensors each get a defined behaviour — computed as PyTorch computes them, or one clear
InputError."""

import pytest
import runtimes
import torch

from etmlx.runtime_shim.errors import InputError
from examples import models
from lowering_harness import assert_close, lower


@pytest.fixture(scope="module")
def mlp():
    module, inputs, dynamic_shapes = models.mlp_dynamic_batch()
    return module.eval(), lower(module, inputs, dynamic_shapes).program


def _same_as_eager(module, program, x):
    with torch.no_grad():
        assert_close(program.forward(x), module(x))


def test_non_contiguous_input(mlp):
    module, program = mlp
    x = torch.randn(64, 6).t()  # (6, 64), column-major
    assert not x.is_contiguous()
    _same_as_eager(module, program, x)
    _same_as_eager(module, program, torch.randn(12, 64)[::2])  # strided rows


def test_nan_and_inf_flow_through_as_in_pytorch(mlp):
    module, program = mlp
    x = torch.randn(4, 64)
    x[0, 3], x[1, 5], x[2, 7] = float("nan"), float("inf"), -float("inf")
    _same_as_eager(module, program, x)


def test_empty_batch(mlp):
    module, program = mlp
    _same_as_eager(module, program, torch.randn(0, 64))


def test_meta_tensor_is_refused(mlp):
    _, program = mlp
    with pytest.raises(InputError, match="input 0 is a meta tensor, which holds no data"):
        program.forward(torch.empty(4, 64, device="meta"))


def test_dimension_past_its_bound_is_refused(mlp):
    _, program = mlp
    with pytest.raises(InputError, match=r"input 0 has shape \(100000, 64\), expected \(<=64, <=64\)"):
        program.forward(torch.zeros(100000, 64))
