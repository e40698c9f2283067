"""A language model traced with its first three layers and the others written as copies
(``etmlx.llm.repeated_layers``) is the program of the whole trace: the same operations,
the same numbers on both runtimes; layers that do not repeat are traced whole."""

import logging

import numpy as np
import pytest
import runtimes
import torch
from repeated import COMPARED_WHOLE, IN_MAKE_TEST, LAYERS, PROMPT, calls, check_traced_once_per_layer, nodes, tiny

import etmlx
from etmlx.llm import repeated_layers
from etmlx.lowering.repeated_layers import LayersTraced
from etmlx.quant.weights import quantized_copy
from examples import llm


@pytest.mark.parametrize("family, names", zip(COMPARED_WHOLE, [("forward", "verify"), ("forward",)]))
def test_copied_layers_compute_what_the_whole_trace_does(tmp_path, monkeypatch, family, names):
    """The methods of an int4 model, dense (forward, verify) and a mixture of experts (whose
    quantized stacks are each layer's own): the repeated program holds the whole trace's
    operations, and gives its logits bit for bit on both runtimes."""
    model, _ = quantized_copy(tiny(family), "int4", 32)
    options = dict(verify="verify" in names)
    methods = llm.export_methods(model, **options)
    assert all(isinstance(methods[name], LayersTraced) for name in names)
    repeated = etmlx.export_methods(methods, tmp_path / "repeated.pte").path
    monkeypatch.setattr(repeated_layers, "FAMILIES", ())
    whole_methods = llm.export_methods(model, **options)
    assert not isinstance(whole_methods["forward"], LayersTraced)
    whole = etmlx.export_methods(whole_methods, tmp_path / "whole.pte").path
    assert nodes(repeated) == nodes(whole)
    kind, least = {"Llama": ("QuantizedMatmul", 7 * LAYERS), "Mixtral": ("GatherQmm", 2 * LAYERS)}[family]
    assert nodes(repeated)["forward"]["Sdpa"] == LAYERS and nodes(repeated)["forward"][kind] >= least
    for method in names:
        for ours, theirs in zip(calls(runtimes.load(repeated), method), calls(runtimes.load(whole), method)):
            np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("family", IN_MAKE_TEST)
def test_each_family_traced_once_per_layer_generates_eager_tokens(tmp_path, family):
    check_traced_once_per_layer(family, tmp_path)


def test_layers_that_do_not_repeat_are_traced_whole(tmp_path, monkeypatch, caplog):
    """A model whose third layer computes another function (its MLP's activation): told its
    layers repeat, the graph pass finds the second and third differ, says so, and the
    export traces every layer."""
    model = tiny("Llama")
    model.model.layers[2].mlp.act_fn = torch.nn.GELU()
    assert not repeated_layers.repeats(model)
    monkeypatch.setattr(repeated_layers, "repeats", lambda model: True)
    methods = llm.export_methods(model)
    assert isinstance(methods["forward"], LayersTraced)
    with caplog.at_level(logging.INFO, logger="etmlx"):
        path = etmlx.export_methods(methods, tmp_path / "lm.pte").path
    assert "etmlx traces every layer: forward: layer 1 has 82 operations and layer 2 has 81" in caplog.text
    assert nodes(path)["forward"]["Sdpa"] == LAYERS
    assert llm.greedy(etmlx.load(path), PROMPT, 10) == llm.eager_greedy(model, PROMPT, 10)


def test_a_layer_of_another_shape_is_not_repeated():
    model = tiny("Llama")
    assert repeated_layers.repeats(model)
    model.model.layers[3].mlp.up_proj = torch.nn.Linear(64, 96, bias=False)
    assert not repeated_layers.repeats(model)
    assert not repeated_layers.repeats(tiny("Llama", num_hidden_layers=4))  # too few to gain


def test_a_layer_quantized_to_another_width_is_not_repeated():
    """As a GGUF file's Q4_K_M has it: one class and shape of weight, other bits."""
    model = tiny("Llama")
    narrow, _ = quantized_copy(model, "int4", 32)
    wide, _ = quantized_copy(model, "int8", 32)
    assert repeated_layers.repeats(narrow)
    narrow.model.layers[3].mlp.up_proj = wide.model.layers[3].mlp.up_proj
    assert not repeated_layers.repeats(narrow)


def test_every_module_of_a_first_layers_model_reads_its_config():
    """transformers' settings made on the model of a model's first layers (the experts'
    implementation its trace sets, say) reach its layers; the model's own are untouched."""
    from etmlx.llm.first_layers import first_layers

    model = tiny("Mixtral")
    short = first_layers(model, 3)
    assert len(short.model.layers) == 3 and short.config.num_hidden_layers == 3
    configs = {id(module.config) for module in short.modules() if hasattr(module, "config")}
    assert configs == {id(short.config)}
    assert all(module.config is model.config for module in model.modules() if hasattr(module, "config"))
    assert len(model.model.layers) == LAYERS and model.config.num_hidden_layers == LAYERS
    assert short.model.layers[1].mlp.experts.gate_up_proj is model.model.layers[1].mlp.experts.gate_up_proj


def test_a_first_layers_model_leaves_the_model_whole_where_no_layer_holds_its_config():
    """The modules on the way to the layer list are copied even where nothing under them
    holds the config: cutting the list then cuts the copy's, never the model's."""
    from types import SimpleNamespace

    from etmlx.llm.first_layers import first_layers

    class Body(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(4))

    class Top(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(num_hidden_layers=4)
            self.config.get_text_config = lambda: self.config
            self.body = Body()

    model = Top()
    short = first_layers(model, 2)
    assert len(short.body.layers) == 2 and len(model.body.layers) == 4
    assert short.body.layers[1] is model.body.layers[1]
