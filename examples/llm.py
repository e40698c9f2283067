"""A tiny Llama from Hugging Face transformers, exported for generation with a KV cache.

The model is built from a small config with random weights (nothing is downloaded).
Its static KV cache is a set of module buffers, written at ``cache_position`` by each
call; etmlx keeps them inside the MLX delegate, and because the ``prefill`` and
``decode`` methods name the same buffers, they share one cache at run time. Each call
also takes a ``window`` (``etmlx.causal_lm``): attention reads only that many slots of
the cache, so a step costs what the tokens in the cache cost, not its capacity.
"""

import os
import warnings

import torch
from torch.export import Dim

from etmlx import causal_lm

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


def with_static_cache(model, max_cache: int):
    """``model`` in eval mode, generating over a static cache of ``max_cache`` tokens
    (what the exports here trace)."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        use_cache=True,
        cache_implementation="static",
        max_length=max_cache,
        cache_config={"batch_size": 1, "max_cache_len": max_cache},
    )
    return model.eval()


def export_methods(model, max_prompt: int = 32) -> dict:
    """``{"prefill": ..., "decode": ...}`` ExportedPrograms over one static cache with
    windowed attention: each takes ``(input_ids, cache_position, window)``."""
    return causal_lm.export_methods(model, max_prompt)


def export_whole_cache_methods(model, max_prompt: int = 32) -> dict:
    """The same methods as transformers' own export wrapper writes them, attending over
    the whole cache at every step: ``(input_ids, cache_position)``."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    wrapper = TorchExportableModuleForDecoderOnlyLM(model)
    seq = Dim("seq", min=2, max=max_prompt)
    with torch.no_grad(), warnings.catch_warnings():
        # transformers' output-capturing global trips a dynamo side-effect warning
        warnings.filterwarnings("ignore", message="While compiling, we found certain side effects")
        prefill = wrapper.export(
            input_ids=torch.zeros(1, 4, dtype=torch.long),
            cache_position=torch.arange(4),
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
        )
        decode = wrapper.export(input_ids=torch.zeros(1, 1, dtype=torch.long), cache_position=torch.tensor([0]))
    return {"prefill": prefill, "decode": decode}


def window_inputs(filled: int, capacity) -> tuple:
    """The inputs a call takes after ``input_ids`` and ``cache_position``: the window
    (``capacity`` is the cache's) for methods of ``export_methods``; none for those of
    ``export_whole_cache_methods`` (``capacity=None``)."""
    return () if capacity is None else (causal_lm.window(filled, capacity),)


def greedy(program, prompt: list, new_tokens: int, capacity=MAX_CACHE) -> list:
    """Greedy generation with a loaded etmlx program: one prefill call, then decode;
    ``capacity`` as for ``window_inputs``."""
    tokens = list(prompt)
    logits = program.prefill(torch.tensor([prompt]), torch.arange(len(prompt)), *window_inputs(len(prompt), capacity))
    for _ in range(new_tokens):
        tokens.append(int(logits[0, -1].argmax()))
        if len(tokens) == len(prompt) + new_tokens:
            break
        position = len(tokens) - 1
        window = window_inputs(position + 1, capacity)
        logits = program.decode(torch.tensor([[tokens[-1]]]), torch.tensor([position]), *window)
    return tokens


def eager_greedy(model, prompt: list, new_tokens: int) -> list:
    """The reference: transformers' own greedy generation, in eager PyTorch."""
    length = len(prompt) + new_tokens
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_length=length, min_length=length, do_sample=False)
    return out[0].tolist()
