"""Every image family of transformers that takes pixels (examples/transformers_vision.py:
classifiers, semantic segmenters, backbones) exported whole -- one delegate, no
kernel outside it -- and run on both runtimes, equal to eager. ``make test-vision``
runs it (CI too): some sixty exports, kept out of ``make test``'s minutes.

Families left out, with why: dinat (needs the natten package), imagegpt (takes color
cluster ids, not pixels), siglip2 (NaFlex patches with their own mask and shapes),
shieldgemma2 (a vision-language model: issue 40), timm_wrapper and timm_backbone (need
timm)."""

import pytest
import torch

from examples import transformers_vision
from lowering_harness import lower

# Of the largest output value: tiny models' outputs range from 0.1 to 1e8 in scale.
RELATIVE_TOLERANCE = 2e-5


@pytest.mark.parametrize("name", sorted(transformers_vision.FAMILIES))
def test_family_exports_whole_and_runs_equal_to_eager(name):
    module, inputs = transformers_vision.build(name, tiny=True)
    lowered = lower(module, inputs)
    assert len(lowered.delegates) == 1 and lowered.kernels == [], lowered.report.to_text()
    with torch.no_grad():
        expected = module(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = lowered.program.forward(*inputs)  # every runtime, checked to agree with each other
    actual = actual if isinstance(actual, tuple) else (actual,)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.shape == want.shape and got.dtype == want.dtype
        scale = want.abs().max().item()
        assert 0 < scale < float("inf")
        assert (got - want).abs().max().item() <= RELATIVE_TOLERANCE * scale, name
