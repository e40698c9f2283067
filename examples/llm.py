"""A tiny Llama from Hugging Face transformers, exported for generation with a KV cache.

The model is built from a small config with random weights (nothing is downloaded).
Its static KV cache is a set of module buffers, written at ``cache_position`` by each
call of ``forward`` (prefill chunks and decode steps alike); etmlx keeps them inside the
MLX delegate, and attention reads only the filled part of the cache (``etmlx.llm.causal_lm``),
so a step costs what the tokens in the cache cost, not its capacity.
"""

import os
import warnings

import torch
from torch.export import Dim

from etmlx.llm import causal_lm, generation

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from configs: nothing to download

MAX_CACHE = 64


def tiny_llama(seed: int = 0, max_cache: int = MAX_CACHE, hidden: int = 64, layers: int = 2):
    """A LlamaForCausalLM with grouped-query attention (4 heads, 2 kv); by default
    2 layers of hidden size 64."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_cache,
    )
    return with_static_cache(LlamaForCausalLM(config), max_cache)


def tiny_mixtral(seed: int = 0, max_cache: int = MAX_CACHE, hidden: int = 64, layers: int = 2, experts: int = 8):
    """A MixtralForCausalLM (mixture of experts: each token's top 2 of ``experts``
    SwiGLU experts of width 2 * hidden), attention as in ``tiny_llama``."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    config = MixtralConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_cache,
        num_local_experts=experts, num_experts_per_tok=2,
    )
    return with_static_cache(MixtralForCausalLM(config), max_cache)


# Families whose layers keep a recurrent state (etmlx.llm.recurrent_state): their config
# class, causal-LM class, and what places and sizes their recurrent layers.
HYBRIDS = {
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(layer_types=["conv", "full_attention", "conv"])),
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", dict(
        layer_types=["conv", "full_attention", "conv"], num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32)),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(
        layer_types=["linear_attention", "linear_attention", "full_attention"], head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(
        layer_types=["linear_attention", "linear_attention", "full_attention"], head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        layer_types=["linear_attention", "linear_attention", "full_attention"], head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(
        num_heads=8, head_dim=16, n_groups=2, state_size=16, expand=2)),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", dict(
        head_dim=16, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", dict(
        layer_types=["mamba", "attention", "mamba"], num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=64, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16)),
    "bamba": ("BambaConfig", "BambaForCausalLM", dict(
        attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16)),
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(state_size=16, expand=2, conv_kernel=4)),
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM", dict(state_size=16, expand=2, conv_kernel=4)),
    "jamba": ("JambaConfig", "JambaForCausalLM", dict(
        attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=4,
        num_experts_per_tok=2, mamba_d_state=16, mamba_expand=2, mamba_d_conv=4, mamba_dt_rank=8)),
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM", dict(
        layer_types=["linear_attention", "hybrid", "linear_attention"], hybrid_layer_ids=[1], mamba_d_state=16,
        n_mamba_heads=8, mamba_headdim=16, use_mem_rope=True)),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", dict(
        layers_block_type=["linear_attention", "full_attention", "mlp"], head_dim=16, ssm_state_size=16,
        mamba_num_heads=8, mamba_head_dim=16, n_groups=2)),
}


def tiny_hybrid(family: str, seed: int = 0, max_cache: int = MAX_CACHE):
    """A 3-layer causal LM of a family whose layers keep a recurrent state (``HYBRIDS``;
    all but Mamba2 with attention too), hidden size 64, its weights scaled up so that
    greedy text varies."""
    import transformers

    config_class, model_class, layers = HYBRIDS[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_cache, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        **layers,
    )
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3.0)
    return with_static_cache(model, max_cache)


def with_static_cache(model, max_cache: int):
    """``model`` in eval mode, generating over a static cache of ``max_cache`` tokens
    (what the exports here trace)."""
    return causal_lm.with_static_cache(model, max_cache)


def export_methods(model, max_seq_len: int = 32, **options) -> dict:
    """``causal_lm.export_methods``: ``forward(tokens, cache_position)`` over one static
    cache with windowed attention, and the runner's constant methods."""
    return causal_lm.export_methods(model, max_seq_len, **options)


def stepwise_logits(model, tokens: list, **cache) -> torch.Tensor:
    """``[len(tokens), vocab]``: the logits the exported ``forward`` computes at each
    position, one call a position, in eager PyTorch; ``cache``: ``kv_bits`` and
    ``kv_group_size`` of ``export_methods``, so the quantized cache's own reference."""
    from etmlx.llm.windowed_cache import WindowedCausalLM, windowed_attention

    module = WindowedCausalLM(model, **cache)
    with windowed_attention(model), torch.no_grad():
        return torch.cat([module(torch.tensor([[token]]), torch.tensor([i])) for i, token in enumerate(tokens)])


def export_whole_cache_methods(model, max_seq_len: int = 32) -> dict:
    """``forward`` as transformers' own export wrapper writes it, attending over the whole
    cache at every step: ``(input_ids, cache_position) -> logits [1, n, vocab]``."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    wrapper = TorchExportableModuleForDecoderOnlyLM(model)
    seq = Dim("seq", min=1, max=max_seq_len)
    with torch.no_grad(), warnings.catch_warnings():
        # transformers' output-capturing global trips a dynamo side-effect warning
        warnings.filterwarnings("ignore", message="While compiling, we found certain side effects")
        forward = wrapper.export(
            input_ids=torch.zeros(1, 2, dtype=torch.long),
            cache_position=torch.arange(2),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
        )
    return {"forward": forward}


def greedy(program, prompt: list, new_tokens: int) -> list:
    """Greedy generation with a loaded etmlx program (``etmlx.llm.generation``): the prompt,
    then ``new_tokens`` tokens, EOS or not (as ``eager_greedy`` generates them)."""
    session = generation.Session(program)
    return list(prompt) + list(generation.generate_tokens(session, list(prompt), new_tokens, stop_at_eos=False))


def eager_greedy(model, prompt: list, new_tokens: int) -> list:
    """The reference: transformers' own greedy generation, in eager PyTorch, of exactly
    ``new_tokens`` tokens (an EOS token neither stops it nor is kept from being chosen)."""
    import copy

    config = copy.deepcopy(model.generation_config)
    # No stop token ([]: None would fall back to the model's own)
    config.eos_token_id, config.pad_token_id = [], 0
    config.max_length, config.do_sample = len(prompt) + new_tokens, False
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return out[0].tolist()


CORPUS = [
    "the quick brown fox jumps over the lazy dog", "a model on a mac computes what it computed in torch",
    "tokens in, text out: every step reads the cache", "hello world, hello mlx, hello executorch",
    "small numbers 0 1 2 3 4 5 6 7 8 9 and marks . , ; : ! ? ( ) [ ] { } - + * / = < > @ # $ % & ' \" ` ~ ^ _ | \\",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz",
]


def train_tokenizer(vocab_size: int = 128):
    """A byte-level BPE trained on ``CORPUS`` whose every token is printable ASCII (or a
    space), so any sequence of ids decodes to valid text; ids 0, 1, 2 are <unk>, <s> and
    </s>, the defaults of transformers' Llama config. Returns a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    printable = [chr(c) for c in range(32, 127)]
    alphabet = sorted({symbol for c in printable for symbol in byte_level.pre_tokenize_str(c)[0][0]})
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer, tokenizer.decoder = byte_level, decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=alphabet, limit_alphabet=len(alphabet), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


# The tiny checkpoints' chat template (and the tiny GGUF files', examples/llm_gguf.py).
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def tiny_checkpoint(directory, seed: int = 0, max_cache: int = MAX_CACHE, **sizes) -> str:
    """A Hugging Face checkpoint folder as users have them (``config.json``, safetensors,
    ``tokenizer.json``, ``tokenizer_config.json`` with a chat template): ``tiny_llama``'s
    weights, scaled up so that greedy text varies, and ``train_tokenizer``'s tokenizer."""
    model = tiny_llama(seed, max_cache, **sizes)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)  # random weights at the default scale make every greedy step alike
    tokenizer = train_tokenizer(model.config.vocab_size)
    tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)
