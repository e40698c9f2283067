"""Tool calls in a model's text (``etmlx.serve.tool_calls``) and the grammars that force
them or a JSON reply (``etmlx.serve.grammar``), without a server."""

import json

import numpy as np
import pytest

from etmlx.llm.generation import Sampler, Sampling
from etmlx.serve import grammar, tool_calls
from examples import llm


def test_calls_are_parsed_and_the_rest_stays_text():
    text = ('let me look. <tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
            '<tool_call>{"name": "time", "arguments": {}}</tool_call> <tool_call>not json</tool_call>')
    content, calls = tool_calls.parse(text)
    assert content == "let me look.  <tool_call>not json</tool_call>"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("weather", {"city": "Oslo"}), ("time", {})]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert tool_calls.parse("no calls <tool_call>{\"name\": 1}</tool_call>")[1] == []


def test_a_stream_holds_back_what_may_be_a_call():
    held = tool_calls.Held()
    shown = [held.add(piece) for piece in ["Sure", ", <tool", "_call>{\"name\": \"f\", ", "\"arguments\": {}}</tool_call>"]]
    assert shown == ["Sure", ", ", "", ""]
    rest, calls = held.finish()
    assert rest == "" and calls[0]["function"]["name"] == "f"
    plain = tool_calls.Held()
    assert plain.add("a <tool") == "a " and plain.add("kit") == "<toolkit" and plain.finish() == ("", [])


@pytest.fixture(scope="module")
def tokens():
    tokenizer = llm.train_tokenizer(128)
    return grammar.Tokens(tokenizer, 128, [2]), tokenizer


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}}


@pytest.mark.parametrize("make, schema", [
    (lambda: grammar.json_grammar(SCHEMA), SCHEMA), (lambda: grammar.json_grammar(None), None),
    (lambda: grammar.tool_call_grammar([{"function": {"name": "f", "parameters": SCHEMA}}]), SCHEMA),
])
def test_random_logits_within_the_mask_write_what_the_grammar_accepts(tokens, make, schema):
    """Draws from random logits, masked step by step, always end in accepted text."""
    vocab, tokenizer = tokens
    rng = np.random.default_rng(0)
    for seed in range(5):
        constraint, sampler, ids = grammar.Constraint(vocab, make()), Sampler(Sampling(temperature=1.0, seed=seed)), []
        while not constraint.finished:
            token = sampler(rng.normal(size=128) * 3, allowed=constraint.allowed(128))
            constraint.accept(token)
            ids.append(token)
        text = tokenizer.decode(ids[:-1] if ids[-1] == 2 else ids)  # the grammar ends it, or an EOS it allowed
        if text.startswith("<tool_call>"):
            text = text.removeprefix("<tool_call>").removesuffix("</tool_call>")
            call = json.loads(text)
            assert call["name"] == "f"
            text = json.dumps(call["arguments"])
        value = json.loads(text)
        assert isinstance(value, dict)
        if schema:
            assert set(value) == {"name", "age", "tags"} and len(value["name"]) <= 5 and 0 <= value["age"] <= 120


def test_a_schema_that_cannot_be_enforced_is_named():
    with pytest.raises(grammar.GrammarError, match="schema"):
        grammar.json_grammar({"type": "nonsense"})
