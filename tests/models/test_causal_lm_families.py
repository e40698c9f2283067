"""``etmlx.causal_lm`` beyond Llama: other transformers families through the same
windowed-attention wrapper generate eager PyTorch's greedy tokens."""

import pytest
import runtimes
import torch

import etmlx
from etmlx.inspection import inspect_program
from examples import llm
from windowing import reads_a_window, window_slices

CAPACITY = 512
PROMPT = [5, 17, 42, 8, 99, 3]


def _tiny_causal_lm(family: str):
    """A 2-layer model of a transformers family with a static cache of CAPACITY slots."""
    import transformers

    torch.manual_seed(0)
    if family == "Gemma2":
        config = transformers.Gemma2Config(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=CAPACITY,
        )
        model = transformers.Gemma2ForCausalLM(config)
    elif family == "StableLm":
        config = transformers.StableLmConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=CAPACITY,
        )
        model = transformers.StableLmForCausalLM(config)
    elif family == "GPT2":
        config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=CAPACITY)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = getattr(transformers, f"{family}Config")(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=CAPACITY,
        )
        model = getattr(transformers, f"{family}ForCausalLM")(config)
    return llm.with_static_cache(model, CAPACITY)


@pytest.mark.parametrize("family, ropes", [("Qwen3", 2 * 2), ("GPT2", 0), ("Gemma2", 2 * 2), ("StableLm", None)])
def test_other_families_generate_eager_tokens(tmp_path, family, ropes):
    """Qwen3 (q/k norms, rotary embeddings fused: q and k of each layer), GPT-2 (learned
    positions, fused qkv), Gemma 2 (attention logits softcapped: its own eager attention
    over the window, which SDPA cannot compute) and StableLM (partial rotary embeddings; its
    attention drops the call's keyword arguments) through the same wrapper."""
    model = _tiny_causal_lm(family)
    result = etmlx.export_methods(llm.export_methods(model), tmp_path / "lm.pte")
    assert result.report.fully_delegated
    assert reads_a_window(result.path) if family != "Gemma2" else window_slices(result.path) >= 3 * 2  # k, v, mask
    nodes = inspect_program(result.path)["methods"]["forward"]["delegates"][0]["nodes"]
    assert ropes is None or nodes.count("Rope") == ropes and "Cos" not in nodes
    assert ("Sdpa" in nodes) == (family != "Gemma2")  # Gemma 2: its eager, softcapped attention
    assert llm.greedy(runtimes.load(result.path), PROMPT, 12) == llm.eager_greedy(model, PROMPT, 12)
