"""Tiny Hugging Face models whole on MLX: one delegate, nothing outside, within 1e-4."""

import pytest
import torch

from examples import hf_models
from lowering_harness import lower

STATIC = ["tiny_llama", "tiny_gpt2", "tiny_bert", "tiny_vit", "tiny_resnet", "tiny_whisper_encoder", "tiny_whisper_decoder"]
DYNAMIC = ["tiny_llama", "tiny_gpt2", "tiny_bert", "tiny_whisper_decoder"]


def _assert_whole_and_close(lowered, module, inputs):
    assert len(lowered.delegates) == 1 and lowered.kernels == [], lowered.report.to_text()
    with torch.no_grad():
        expected = module(*inputs)
    actual = lowered.program.forward(*inputs)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", STATIC)
def test_static(name):
    module, inputs, _ = getattr(hf_models, name)()
    lowered = lower(module, inputs)
    _assert_whole_and_close(lowered, module, inputs)
    if name not in ("tiny_resnet",):
        assert "Sdpa" in lowered.nodes  # attention kept on the fused kernel


def _with_length(inputs, length):
    tokens = torch.randint(0, hf_models.VOCAB, (inputs[0].shape[0], length))
    return (tokens, *inputs[1:])


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_sequence(name):
    module, inputs, dynamic_shapes = getattr(hf_models, name)(dynamic=True)
    lowered = lower(module, inputs, dynamic_shapes)
    for length in (2, 11, 32):
        _assert_whole_and_close(lowered, module, _with_length(inputs, length))


def test_llama_gqa_repeat_is_absorbed():
    module, inputs, _ = hf_models.tiny_llama()
    lowered = lower(module, inputs)
    # 2 kv heads reach the kernel un-repeated: no repeat_kv broadcast before any Sdpa
    (delegate,) = lowered.delegates
    sdpa_at = [i for i, n in enumerate(lowered.nodes) if n == "Sdpa"]
    assert len(sdpa_at) == 2 and "BroadcastTo" not in lowered.nodes[sdpa_at[0] - 3 : sdpa_at[0]]
