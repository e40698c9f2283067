"""Tiny language models of the families whose layers ``etmlx.llm.repeated_layers`` traces
once (``SETTINGS``: every family in its ``FAMILIES``), and what their tests read of an
export: tests/models/test_repeated_layers.py checks the mechanism and a few families,
tests/sweep/test_repeated_layer_families.py the others."""

import collections

import numpy as np
import torch
import transformers

import etmlx
from etmlx.inspection import inspect_program
from etmlx.lowering.repeated_layers import LayersTraced
from examples import llm

CAPACITY = 64
LAYERS = 5
PROMPT = [5, 17, 42, 8, 99, 3]
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
# transformers' class prefix -> the settings its tiny model needs beyond ``tiny``'s
SETTINGS = {
    "Llama": {}, "Mistral": {}, "Qwen2": {}, "Qwen3": {}, "Phi3": {}, "Gemma": {}, "Granite": {}, "Olmo2": {},
    "Olmo": {}, "Phi": {}, "StableLm": {}, "Starcoder2": {}, "Cohere": {}, "Glm": {"head_dim": 16},
    "Glm4": {"head_dim": 16}, "Ernie4_5": {}, "Apertus": {}, "Arcee": {},
    "Mixtral": dict(num_local_experts=4, num_experts_per_tok=2), "Qwen3Moe": MOE,
    "Qwen2Moe": dict(MOE, shared_expert_intermediate_size=64), "Olmoe": dict(num_experts=4, num_experts_per_tok=2),
}
# what make test runs (tests/models/test_repeated_layers.py): these generate, Llama and Mixtral
# compare with their whole trace; the sweep (make test-vision) runs the others
IN_MAKE_TEST = ("Mistral", "Qwen2", "Qwen3", "Phi3", "Gemma", "Granite", "Olmo2")
COMPARED_WHOLE = ("Llama", "Mixtral")


def tiny(family: str, **settings):
    """A random ``LAYERS``-layer model of ``family`` (a class prefix of ``SETTINGS``)."""
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(
        **{"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": LAYERS,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": CAPACITY,
           "initializer_range": 0.2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
           **SETTINGS.get(family, {}), **settings})
    return llm.with_static_cache(getattr(transformers, f"{family}ForCausalLM")(config).eval(), CAPACITY)


def nodes(path) -> dict:
    """``{method: Counter of its delegate's node kinds}``."""
    methods = inspect_program(path)["methods"]
    return {name: collections.Counter(method["delegates"][0]["nodes"]) for name, method in methods.items()
            if method.get("delegates")}


def calls(program, method="forward") -> list:
    """Logits of a prefill, then of three decode steps."""
    outputs = [program.run_method(method, [torch.tensor([PROMPT]), torch.arange(len(PROMPT))])[0]]
    for position, token in enumerate([7, 11, 13], start=len(PROMPT)):
        outputs.append(program.run_method(method, [torch.tensor([[token]]), torch.tensor([position])])[0])
    return [np.asarray(output) for output in outputs]


def check_traced_once_per_layer(family: str, tmp_path) -> None:
    """``family``'s model is traced three layers deep, its program holds an attention per
    layer, and it generates eager's greedy tokens."""
    model = tiny(family)
    methods = llm.export_methods(model)
    assert isinstance(methods["forward"], LayersTraced)
    path = etmlx.export_methods(methods, tmp_path / "lm.pte").path
    assert nodes(path)["forward"]["Sdpa"] == LAYERS
    assert llm.greedy(etmlx.load(path), PROMPT, 10) == llm.eager_greedy(model, PROMPT, 10)
