"""``etmlx.llm.causal_lm`` beyond Llama: other transformers families through the same
windowed-attention wrapper generate eager PyTorch's greedy tokens."""

import pytest
import runtimes
import torch

import etmlx
from etmlx.inspection import inspect_program
from examples import llm
from windowing import reads_a_window

CAPACITY = 512
PROMPT = [5, 17, 42, 8, 99, 3]


def _tiny_causal_lm(family: str):
    """A 2-layer model of a transformers family with a static cache of CAPACITY slots."""
    import transformers

    torch.manual_seed(0)
    if family == "StableLm":
        config = transformers.StableLmConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=CAPACITY,
        )
        model = transformers.StableLmForCausalLM(config)
    elif family == "GPT2":
        config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=CAPACITY)
        model = transformers.GPT2LMHeadModel(config)
    elif family == "GPTJ":
        config = transformers.GPTJConfig(vocab_size=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=CAPACITY)
        model = transformers.GPTJForCausalLM(config)
    elif family == "Falcon":  # multi-query: one key/value head, though its config counts four
        config = transformers.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           max_position_embeddings=CAPACITY)
        model = transformers.FalconForCausalLM(config)
    elif family == "DeepseekV3":  # latent attention (values narrower than keys), routed experts
        config = transformers.DeepseekV3Config(
            vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=8, max_position_embeddings=CAPACITY,
        )
        model = transformers.DeepseekV3ForCausalLM(config)
    else:
        config = getattr(transformers, f"{family}Config")(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=CAPACITY,
        )
        model = getattr(transformers, f"{family}ForCausalLM")(config)
    if family in ("GPTJ", "Falcon", "DeepseekV3"):
        with torch.no_grad():  # at their default scale, greedy text repeats one token
            for parameter in model.parameters():
                parameter.mul_(3.0)
    return llm.with_static_cache(model, CAPACITY)


@pytest.mark.parametrize("family, ropes", [("Qwen3", 2 * 2), ("GPT2", 0), ("StableLm", None)])
def test_other_families_generate_eager_tokens(tmp_path, family, ropes):
    """Qwen3 (q/k norms, rotary embeddings fused: q and k of each layer), GPT-2 (learned
    positions, fused qkv) and StableLM (partial rotary embeddings; its attention drops the
    call's keyword arguments) through the same wrapper. (Gemma 2's softcapped attention:
    tests/models/test_sliding_window.py.)"""
    model = _tiny_causal_lm(family)
    result = etmlx.export_methods(llm.export_methods(model), tmp_path / "lm.pte")
    assert result.report.fully_delegated and reads_a_window(result.path)
    nodes = inspect_program(result.path)["methods"]["forward"]["delegates"][0]["nodes"]
    assert ropes is None or nodes.count("Rope") == ropes and "Cos" not in nodes
    assert "Sdpa" in nodes
    assert llm.greedy(runtimes.load(result.path), PROMPT, 12) == llm.eager_greedy(model, PROMPT, 12)


@pytest.mark.parametrize("family", ["GPTJ", "Falcon", "DeepseekV3"])
def test_families_outside_the_attention_interface_or_the_static_cache_generate_eager_tokens(tmp_path, family, caplog):
    """GPT-J and Falcon compute attention without transformers' AttentionInterface: traced
    with their own attention over the whole cache, named in a warning. Falcon's attention
    writes one key/value head and DeepSeek-V3's values are narrower than its keys, which
    transformers' static cache does not allocate: etmlx allocates what they write. DeepSeek-V3's
    router keeps its unsorted top-k (and what it feeds) on ExecuTorch's kernels."""
    model = _tiny_causal_lm(family)
    with caplog.at_level("WARNING", logger="etmlx"):
        result = etmlx.export_methods(llm.export_methods(model), tmp_path / "lm.pte")
    assert ("does not call attention through transformers' AttentionInterface" in caplog.text) == (family != "DeepseekV3")
    declined = {op for op, entry in result.report.operators.items() if entry.declined}
    assert declined == ({"aten::topk", "aten::scatter.value", "dim_order_ops::_empty_dim_order"}
                        if family == "DeepseekV3" else set())
    buffers = {b["name"]: b["shape"] for d in inspect_program(result.path)["methods"]["forward"]["delegates"]
               for b in d["buffers"]}
    assert family != "Falcon" or buffers["cached.key_cache_0"][1] == 1
    assert family != "DeepseekV3" or buffers["cached.value_cache_0"][-1] == 8 != buffers["cached.key_cache_0"][-1]
    assert llm.greedy(runtimes.load(result.path), PROMPT, 12) == llm.eager_greedy(model, PROMPT, 12)


@pytest.mark.parametrize("family, form", [("GPT2", "Conv1D"), ("Falcon", "FalconLinear")])
def test_linear_layers_of_another_form_are_quantized(tmp_path, family, form):
    """GPT-2's ``Conv1D`` (``x @ W + b``, the weight a linear one's transpose) and Falcon's
    ``FalconLinear`` (``x @ W.T + b``, which failed on torchao's quantized weight) are
    quantized as linear layers: each a QuantizedMatmul, as the head; the quantized
    model's greedy tokens."""
    from etmlx.quant.weights import quantized_copy

    model = _tiny_causal_lm(family)
    layers = sum(type(module).__name__ == form for module in model.modules())
    embeddings = sum(isinstance(module, torch.nn.Embedding) for module in model.modules())
    quantized, names = quantized_copy(model, "int4", 32)
    assert layers and len(names) == layers + embeddings + 1  # and the head
    result = etmlx.export_methods(llm.export_methods(quantized), tmp_path / "lm.pte")
    nodes = inspect_program(result.path)["methods"]["forward"]["delegates"][0]["nodes"]
    assert nodes.count("QuantizedMatmul") == layers + 1
    assert llm.greedy(runtimes.load(result.path), PROMPT, 12) == llm.eager_greedy(quantized, PROMPT, 12)
