"""Constrained decoding: what a request's ``response_format`` or forced tool call allows
the model to write, as a grammar that llguidance matches token by token.

llguidance was chosen over xgrammar and outlines-core (bench/bench_grammar.py): it
builds no index of the vocabulary up front (a schema costs about a millisecond to
start, where outlines-core's compiled index takes seconds for a nested one), computes a
step's mask in tens of microseconds, covers more of JSON Schema than outlines-core (it
refuses nothing the tests throw at it but what it names), takes Lark grammars for the
text around a tool call's JSON, and needs nothing but its own wheel (xgrammar requires
torch without a pin, and triton, on Linux).

JSON is written compactly (no free whitespace): a model with random weights could
otherwise spend every token on spaces and never close the object.
"""

import json

import numpy as np

from etmlx.llm.generation import GenerationError

_COMPACT = {"whitespace_flexible": False}


class GrammarError(GenerationError):
    """A schema or grammar that llguidance cannot compile (a request's fault)."""


class Tokens:
    """A tokenizer as llguidance reads it, made once per model (about a second for a
    large vocabulary): ``vocab`` entries, a draw of any of ``eos`` ends the text."""

    def __init__(self, tokenizer, vocab: int, eos: list):
        import llguidance.hf

        self.vocab = vocab
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=sorted(eos))


class Constraint:
    """One generation's matcher (``etmlx.llm.generation.decode``'s ``constraint``)."""

    def __init__(self, tokens: Tokens, grammar: str):
        from llguidance import LLMatcher

        self.tokens, self.matcher = tokens, LLMatcher(tokens.tokenizer, grammar, log_level=0)
        self._check()

    def allowed(self, vocab: int) -> np.ndarray:
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), np.uint8), bitorder="little")
        self._check()
        allowed = np.zeros(vocab, dtype=bool)
        allowed[: min(vocab, bits.size)] = bits[:vocab].astype(bool)
        return allowed

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)
        self._check()

    @property
    def finished(self) -> bool:
        return self.matcher.is_stopped()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"the grammar failed: {self.matcher.get_error().splitlines()[0]}")


def json_grammar(schema: dict | None) -> str:
    """A JSON value that ``schema`` accepts (None: any JSON object)."""
    from llguidance import LLMatcher

    try:
        text = LLMatcher.grammar_from_json_schema(schema if schema is not None else {"type": "object"},
                                                  overrides=_COMPACT)
    except ValueError as error:
        raise GrammarError(f"the JSON schema is not valid: {error}") from None
    return _validated(text)


def tool_call_grammar(tools: list) -> str:
    """One call of one of ``tools`` (OpenAI's function definitions) in the Hermes / Qwen
    form the model's template shows: ``<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>``, its arguments accepted by the function's parameter schema."""
    from llguidance import LLMatcher

    calls = [{
        "type": "object",
        "properties": {"name": {"const": tool["function"]["name"]},
                       "arguments": tool["function"].get("parameters") or {"type": "object"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for tool in tools]
    schema = {"anyOf": calls} if len(calls) > 1 else calls[0]
    lark = f'start: "<tool_call>" /\\n?/ %json {json.dumps({**schema, "x-guidance": _COMPACT})} /\\n?/ "</tool_call>"'
    return _validated(LLMatcher.grammar_from_lark(lark))


def _validated(grammar: str) -> str:
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(f"the schema cannot be enforced: {error.splitlines()[0]}")
    return grammar
