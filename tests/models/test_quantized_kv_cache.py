"""A KV cache quantized as MLX quantizes it (``kv_bits``, ``etmlx.llm.quantized_cache``): the
packed cache grows with the tokens held, both runtimes compute what the quantized eager
module computes at every step, and what quantization costs against the float cache is
bounded: 8 bits keep the greedy tokens, 4 bits' divergence is measured and bounded."""

import mlx.core as mx
import numpy as np
import pytest
import torch

import etmlx
from etmlx.llm import causal_lm, generation, prompt_cache
from etmlx.errors import ExportError
from etmlx.inspection import inspect_program
from etmlx.lowering import custom_ops
from examples import llm
from windowing import assert_steps_match

GROUP, STEP, CHUNK = 32, 8, 16
TOKENS = [(7 * i + 3) % 128 for i in range(40)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bits, group_size", [(8, 32), (4, 64), (8, 128)])
def test_quantize_is_mlx_quantize_bit_for_bit(dtype, bits, group_size):
    """The eager kernel the exported module is checked against is MLX's own arithmetic."""
    x = (torch.randn(3, 5, 256) * 3).to(dtype)
    x[0, 0, :group_size] = 0.0  # a group of zeros: scale eps, bias 0
    words, scales, biases = custom_ops.quantize(x, group_size, bits)
    mlx_dtype = {torch.float32: mx.float32, torch.bfloat16: mx.bfloat16, torch.float16: mx.float16}[dtype]
    expected = mx.quantize(mx.array(x.float().numpy()).astype(mlx_dtype), group_size, bits)
    np.testing.assert_array_equal(words.numpy().view(np.uint32), np.array(expected[0]))
    for ours, theirs in zip((scales, biases), expected[1:]):
        assert torch.equal(ours, torch.from_numpy(np.array(theirs.astype(mx.float32))).to(dtype))
    restored = custom_ops.dequantized(words, scales, biases, group_size, bits)
    np.testing.assert_array_equal(restored.float().numpy(), np.array(mx.dequantize(*expected, group_size, bits)
                                                                         .astype(mx.float32)))


@pytest.fixture(scope="module")
def llama():
    """A tiny Llama of 32-wide heads (2 layers, 2 kv heads), its cache at 8 bits."""
    model = llm.tiny_llama(hidden=128)
    return model, llm.stepwise_logits(model, TOKENS)


@pytest.fixture(scope="module")
def int8_export(llama, tmp_path_factory):
    model, _ = llama
    path = tmp_path_factory.mktemp("kv8") / "kv8.pte"
    result = etmlx.export_methods(llm.export_methods(model, CHUNK, window_step=STEP, kv_bits=8, kv_group_size=GROUP),
                                  path)
    assert result.report.fully_delegated
    return path, llm.stepwise_logits(model, TOKENS, kv_bits=8, kv_group_size=GROUP)


def test_the_cache_is_held_packed_and_grows(int8_export):
    """Per layer, keys and values as packed words, scales and biases, each growing along
    the sequence: 40 bytes a position and head where float32 takes 128."""
    path, _ = int8_export
    (delegate,) = inspect_program(path)["methods"]["forward"]["delegates"]
    caches = [b for b in delegate["buffers"] if "cumulative_length" not in b["name"]]
    assert sorted(b["name"].split(".")[1] for b in caches) == sorted(
        f"{kind}_{part}_{layer}" for kind in ("key", "value") for part in ("biases", "cache", "scales") for layer in (0, 1))
    assert all(b["grows_along"] == 2 and b["key"] == "" for b in caches)
    per_slot = 32 * 8 // 8 + 2 * (32 // GROUP) * 4  # packed values, then a float32 scale and bias per group
    assert sum(b["bytes"] for b in caches) == 2 * 2 * 2 * llm.MAX_CACHE * per_slot
    assert delegate["quantized_cache"] == [{"format": "int8", "group_size": GROUP}] * 4 and not delegate["quantized"]
    assert delegate["nodes"].count("Quantize") == 3 * 4 and delegate["nodes"].count("QuantizedMatmul") == 2 * 2


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_logits_equal_the_quantized_eager_module_across_growth_steps(int8_export, runtime):
    """A prefill chunk straddling a window boundary, then decode through four more."""
    path, expected = int8_export
    program = etmlx.load(path, runtime=runtime)
    assert_steps_match(program, TOKENS, expected, prefill=13)


def _relative_error(logits, reference) -> float:
    return float((logits - reference).abs().max() / reference.abs().max())


def test_8_bits_change_a_greedy_choice_only_at_a_near_tie(llama, int8_export):
    """Over the float model's greedy run, the 8-bit cache's logits are within 2% of the
    largest (measured 0.5%), and its greedy choice differs only where the float model's
    top two logits are closer than that error (measured: once in 29 steps, at a margin
    of 2e-4); the .pte's own greedy run follows the float one up to that step."""
    model, _ = llama
    path, _ = int8_export
    run = llm.eager_greedy(model, TOKENS[:8], 32)
    float_logits = llm.stepwise_logits(model, run)[7:-1]  # the choices of the generated tokens
    int8_logits = llm.stepwise_logits(model, run, kv_bits=8, kv_group_size=GROUP)[7:-1]
    error = (int8_logits - float_logits).abs().max()
    assert error / float_logits.abs().max() < 0.02
    top = float_logits.topk(2, dim=-1).values
    flips = (int8_logits.argmax(-1) != float_logits.argmax(-1)).nonzero().flatten().tolist()
    assert len(flips) <= 1 and all(top[i, 0] - top[i, 1] < 2 * error for i in flips), flips
    generated = llm.greedy(etmlx.load(path), TOKENS[:8], 32)
    agreeing = 8 + (flips[0] if flips else len(run) - 8)
    assert generated[:agreeing] == run[:agreeing]
    if flips:
        assert generated[agreeing] == int(int8_logits[flips[0]].argmax())


def test_4_bits_diverge_by_a_measured_bound(llama):
    """Measured: 7.6% of the largest logit; the greedy choice at 38 of 40 positions."""
    model, float_logits = llama
    int4_logits = llm.stepwise_logits(model, TOKENS, kv_bits=4, kv_group_size=GROUP)
    assert _relative_error(int4_logits, float_logits) < 0.15
    agreeing = (int4_logits.argmax(-1) == float_logits.argmax(-1)).float().mean()
    assert agreeing >= 0.85, agreeing


def test_a_saved_prompt_restores_the_packed_cache(int8_export, tmp_path):
    path, expected = int8_export
    saved = generation.Session(etmlx.load(path))
    saved.feed(TOKENS[:20])
    prompt_cache.save(saved.program, tmp_path / "prompt.kv", TOKENS[:20])
    restored = generation.Session(etmlx.load(path, runtime="executorch"))
    restored.position = len(prompt_cache.restore(restored.program, tmp_path / "prompt.kv")[0])
    for position in range(20, 24):
        torch.testing.assert_close(torch.as_tensor(restored.feed([TOKENS[position]])), expected[position],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options, message", [
    (dict(kv_bits=3), "3-bit values"),
    (dict(kv_bits=8, kv_group_size=16), "groups of 16"),
    (dict(kv_bits=8, kv_group_size=64), "heads are 32 wide"),
])
def test_a_cache_mlx_cannot_quantize_is_refused_by_name(llama, options, message):
    with pytest.raises(ExportError, match=message):
        llm.export_methods(llama[0], CHUNK, **options)


def test_a_hybrid_model_quantizes_its_full_layers_and_keeps_its_rings(tmp_path):
    """Gemma 3 (a sliding layer, then a full one) at 4 bits: the ring stays float, the
    full layer's cache is packed; eager's quantized logits at every step past the window."""
    import transformers

    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=8,
        max_position_embeddings=64)
    model = causal_lm.with_static_cache(transformers.Gemma3ForCausalLM(config), 64)
    path = tmp_path / "gemma3.pte"
    etmlx.export_methods(llm.export_methods(model, 8, kv_bits=4, kv_group_size=GROUP), path)
    (delegate,) = inspect_program(path)["methods"]["forward"]["delegates"]
    dtypes = {b["name"].rsplit(".", 1)[-1]: b["dtype"] for b in delegate["buffers"]}
    assert dtypes["key_cache_0"] == "float32" and dtypes["key_cache_1"] == "int32" and "key_scales_0" not in dtypes
    expected = llm.stepwise_logits(model, TOKENS[:18], kv_bits=4, kv_group_size=GROUP)
    for runtime in etmlx.RUNTIMES:
        program = etmlx.load(path, runtime=runtime)
        for start in range(0, 18, 6):
            logits = program.forward(torch.tensor([TOKENS[start:start + 6]]), torch.arange(start, start + 6))
            torch.testing.assert_close(torch.as_tensor(logits)[0], expected[start + 5], rtol=1e-4, atol=1e-5)
