"""The check every hybrid family goes through (tests/models/test_recurrent_families.py
runs one family of each kind, tests/sweep/test_hybrid_families.py all of them): export
with a prompt longer than a call, fully delegated, the recurrent states in the delegate,
and greedy tokens equal to eager transformers' on both runtimes, twice."""

import runtimes
import torch

import etmlx
from etmlx.inspection import inspect_program
from etmlx.llm.recurrent_state import FAMILIES
from examples import llm

CAPACITY, CHUNK = 128, 4
PROMPT = [5, 17, 42, 8, 99, 3, 7, 9, 11]  # more tokens than a call takes


def exported(family: str, directory, quantize=None):
    """(the model, the ExportResult) of ``llm.tiny_hybrid(family)``, calls of CHUNK tokens;
    ``quantize`` ("int4", ...): its linear layers' weights quantized in groups of 32 first
    (the model returned is that quantized one)."""
    from etmlx.quant.weights import quantized_copy

    model = llm.tiny_hybrid(family, max_cache=CAPACITY)
    if quantize is not None:
        model, names = quantized_copy(model, quantize, 32)
        assert names
    return model, etmlx.export_methods(llm.export_methods(model, CHUNK), directory / "lm.pte")


def uncached_greedy(model, prompt: list, new_tokens: int) -> list:
    """Greedy tokens from the whole sequence's forward at each step, no cache: the model's
    own math. (Bamba's cached steps in transformers 5.23 disagree with its forward.)"""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens


def check_generation(model, result) -> None:
    assert result.report.fully_delegated
    delegates = inspect_program(result.path)["methods"]["forward"]["delegates"]
    buffers = {b["name"] for d in delegates for b in d["buffers"]}
    nodes = [node for d in delegates for node in d["nodes"]]
    probe = etmlx.llm.attention_probe.probe(model)
    recurrent = [i for i, states in enumerate(probe.state_shapes) if states]
    assert recurrent and {f"cached.conv_state_{i}_0" for i in recurrent} <= buffers
    attention = [i for i, shape in enumerate(probe.layer_shapes) if shape is not None]
    assert {f"cached.key_cache_{i}" for i in attention} == {b for b in buffers if b.startswith("cached.key_cache_")}
    kind = FAMILIES[model.config.get_text_config().model_type]
    recurrence = {"gated delta nets": "GatedDelta", "Mamba selective state spaces": "SelectiveScan"}.get(kind)
    for node in ("GatedDelta", "SelectiveScan"):  # output and final state: two per layer
        assert nodes.count(node) == (2 * len(recurrent) if node == recurrence else 0), node
    program = runtimes.load(result.path)  # both runtimes, their outputs compared at every call
    expected = uncached_greedy(model, PROMPT, 12)
    assert llm.greedy(program, PROMPT, 12) == expected
    assert llm.greedy(program, PROMPT, 12) == expected  # position 0 starts a new sequence: states zeroed
