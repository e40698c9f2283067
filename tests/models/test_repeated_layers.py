"""A language model traced with its first three layers and the others written as copies
(``etmlx.llm.repeated_layers``) is the program of the whole trace: the same operations,
the same numbers on both runtimes; layers that do not repeat are traced whole."""

import collections
import logging

import numpy as np
import pytest
import runtimes
import torch
import transformers

import etmlx
from etmlx.inspection import inspect_program
from etmlx.llm import repeated_layers
from etmlx.lowering.repeated_layers import LayersTraced
from etmlx.quant.weights import quantized_copy
from examples import llm

CAPACITY = 64
LAYERS = 5
PROMPT = [5, 17, 42, 8, 99, 3]


def _tiny(family: str, **settings):
    torch.manual_seed(0)
    config = getattr(transformers, f"{family}Config")(
        **{"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": LAYERS,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": CAPACITY,
           "initializer_range": 0.2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, **settings})
    return llm.with_static_cache(getattr(transformers, f"{family}ForCausalLM")(config).eval(), CAPACITY)


def _nodes(path) -> dict:
    methods = inspect_program(path)["methods"]
    return {name: collections.Counter(method["delegates"][0]["nodes"]) for name, method in methods.items()
            if method.get("delegates")}


def _calls(program, method="forward") -> list:
    """Logits of a prefill, then of three decode steps."""
    outputs = [program.run_method(method, [torch.tensor([PROMPT]), torch.arange(len(PROMPT))])[0]]
    for position, token in enumerate([7, 11, 13], start=len(PROMPT)):
        outputs.append(program.run_method(method, [torch.tensor([[token]]), torch.tensor([position])])[0])
    return [np.asarray(output) for output in outputs]


def test_copied_layers_compute_what_the_whole_trace_does(tmp_path, monkeypatch):
    """Both methods of an int4 model (forward, verify): the repeated program holds the
    whole trace's operations, and gives its logits bit for bit on both runtimes."""
    model, _ = quantized_copy(_tiny("Llama"), "int4", 32)
    options = dict(verify=True)
    methods = llm.export_methods(model, **options)
    assert all(isinstance(methods[name], LayersTraced) for name in ("forward", "verify"))
    repeated = etmlx.export_methods(methods, tmp_path / "repeated.pte").path
    monkeypatch.setattr(repeated_layers, "FAMILIES", ())
    whole_methods = llm.export_methods(model, **options)
    assert not isinstance(whole_methods["forward"], LayersTraced)
    whole = etmlx.export_methods(whole_methods, tmp_path / "whole.pte").path
    assert _nodes(repeated) == _nodes(whole)
    assert _nodes(repeated)["forward"]["Sdpa"] == LAYERS and _nodes(repeated)["forward"]["QuantizedMatmul"] >= 7 * LAYERS
    for method in ("forward", "verify"):
        for ours, theirs in zip(_calls(runtimes.load(repeated), method), _calls(runtimes.load(whole), method)):
            np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("family", ["Mistral", "Qwen2", "Qwen3", "Phi3", "Gemma", "Granite", "Olmo2"])
def test_each_family_traced_once_per_layer_generates_eager_tokens(tmp_path, family):
    model = _tiny(family)
    methods = llm.export_methods(model)
    assert isinstance(methods["forward"], LayersTraced)
    path = etmlx.export_methods(methods, tmp_path / "lm.pte").path
    assert _nodes(path)["forward"]["Sdpa"] == LAYERS
    assert llm.greedy(etmlx.load(path), PROMPT, 10) == llm.eager_greedy(model, PROMPT, 10)


def test_layers_that_do_not_repeat_are_traced_whole(tmp_path, monkeypatch, caplog):
    """A model whose third layer computes another function (its MLP's activation): told its
    layers repeat, the graph pass finds the second and third differ, says so, and the
    export traces every layer."""
    model = _tiny("Llama")
    model.model.layers[2].mlp.act_fn = torch.nn.GELU()
    assert not repeated_layers.repeats(model)
    monkeypatch.setattr(repeated_layers, "repeats", lambda model: True)
    methods = llm.export_methods(model)
    assert isinstance(methods["forward"], LayersTraced)
    with caplog.at_level(logging.INFO, logger="etmlx"):
        path = etmlx.export_methods(methods, tmp_path / "lm.pte").path
    assert "etmlx traces every layer: forward: layer 1 has 82 operations and layer 2 has 81" in caplog.text
    assert _nodes(path)["forward"]["Sdpa"] == LAYERS
    assert llm.greedy(etmlx.load(path), PROMPT, 10) == llm.eager_greedy(model, PROMPT, 10)


def test_a_layer_of_another_shape_is_not_repeated():
    model = _tiny("Llama")
    assert repeated_layers.repeats(model)
    model.model.layers[3].mlp.up_proj = torch.nn.Linear(64, 96, bias=False)
    assert not repeated_layers.repeats(model)
    assert not repeated_layers.repeats(_tiny("Llama", num_hidden_layers=4))  # too few to gain


def test_a_layer_quantized_to_another_width_is_not_repeated():
    """As a GGUF file's Q4_K_M has it: one class and shape of weight, other bits."""
    model = _tiny("Llama")
    narrow, _ = quantized_copy(model, "int4", 32)
    wide, _ = quantized_copy(model, "int8", 32)
    assert repeated_layers.repeats(narrow)
    narrow.model.layers[3].mlp.up_proj = wide.model.layers[3].mlp.up_proj
    assert not repeated_layers.repeats(narrow)
