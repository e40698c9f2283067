"""The vision models of examples/vision.py whole on MLX: one delegate, no kernel outside
(ConvNeXt's and Swin's pooling of a channels-last result included), eager parity on
both runtimes."""

import pytest
import torch

from examples import vision
from lowering_harness import assert_close, lower


@pytest.mark.parametrize("name", ["mobilenet", "convnext", "swin"])
def test_a_vision_model_is_one_delegate_equal_to_eager(name):
    module, inputs, _ = getattr(vision, name)(size=32)
    lowered = lower(module, inputs)
    assert len(lowered.delegates) == 1 and lowered.kernels == [], lowered.report.summary()
    assert "Conv" in lowered.nodes and ("Sdpa" in lowered.nodes) == (name == "swin")
    with torch.no_grad():
        expected = module(*inputs)
    assert_close(lowered.program.forward(*inputs), expected)
