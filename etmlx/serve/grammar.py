"""Constrained decoding: what a request's ``response_format`` or forced tool call allows
the model to write, as a grammar that llguidance matches token by token.

llguidance was chosen over xgrammar and outlines-core (``bench/bench_grammar.py``, a
32k-token byte-level vocabulary, seven schemas from flat to recursive, 2 cores): it
compiled each schema in 0.5-1.6 ms and masked a step in 15-35 us; xgrammar masked as
fast (12-54 us) but compiled in 1.3-7.9 ms and requires torch (unpinned) and triton
on Linux; outlines-core builds a regex index over the vocabulary up front (7-195 ms)
and took up to 1.1 ms per step. All three accepted all seven schemas. llguidance also
takes Lark grammars, which the text around a forced tool call's JSON needs, and needs
nothing but its own wheel.

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
