"""Grammar engines for constrained decoding, side by side on one tokenizer: how long a
JSON schema takes to compile, how long one step's token mask takes, and which schemas
each takes at all. The reason ``etmlx serve`` enforces ``response_format`` and forced
tool calls with llguidance (etmlx/serve/grammar.py).

    python bench/bench_grammar.py [--vocab 32000] [--steps 64]

The tokenizer is a byte-level BPE of ``--vocab`` tokens trained here on the Python
standard library's sources (nothing is downloaded). Each schema's walk draws ``--steps``
tokens from random logits within the mask, the same draws for every engine. xgrammar
and outlines-core are not etmlx's dependencies: install them beside it to compare
(``pip install outlines-core``; ``pip install --no-deps xgrammar apache-tvm-ffi``, as
xgrammar's own requirements pull an unpinned torch and triton); an engine that is not
installed is left out of the table.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import numpy as np

SCHEMAS = {
    "flat object": {"type": "object", "required": ["name", "age"], "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"}, "member": {"type": "boolean"}}},
    "nested, arrays, enum": {"type": "object", "required": ["order"], "properties": {"order": {
        "type": "object", "required": ["items", "status"], "properties": {
            "items": {"type": "array", "items": {"type": "object", "required": ["sku", "qty"], "properties": {
                "sku": {"type": "string"}, "qty": {"type": "integer"}}}},
            "status": {"enum": ["open", "paid", "shipped"]}}}}},
    "anyOf": {"type": "object", "required": ["shape"], "properties": {"shape": {"anyOf": [
        {"type": "object", "required": ["radius"], "properties": {"radius": {"type": "number"}}},
        {"type": "object", "required": ["w", "h"], "properties": {"w": {"type": "number"}, "h": {"type": "number"}}}]}}},
    "pattern": {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}},
    "recursive $ref": {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "required": ["value"], "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}},
    "map (additionalProperties)": {"type": "object", "additionalProperties": {"type": "number"}},
    "40 properties": {"type": "object", "required": [f"field{i}" for i in range(0, 40, 4)], "properties": {
        f"field{i}": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}][i % 4]
        for i in range(40)}},
}


def train_tokenizer(vocab: int):
    """A byte-level BPE trained on the standard library's ``.py`` files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root = os.path.dirname(json.__file__).rsplit(os.sep, 1)[0]
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) if "site-packages" not in d for f in fs
                   if f.endswith(".py"))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|end|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train(files[:600], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|end|>")


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab):
        import llguidance.hf

        self.vocab, self.tokenizer = vocab, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)

    def start(self, schema):
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer, LLMatcher.grammar_from_json_schema(schema), log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def mask(self, matcher):
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little")
        return bits[: self.vocab].astype(bool)

    def accept(self, matcher, token):
        matcher.consume_token(token)

    def finished(self, matcher):
        return matcher.is_stopped()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab):
        import xgrammar

        self.xgr, self.vocab = xgrammar, vocab
        self.compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab),
                                                 cache_enabled=False)
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab)

    def start(self, schema):
        return self.xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema)))

    def mask(self, matcher):
        matcher.fill_next_token_bitmask(self.bitmask)
        words = self.bitmask.numpy().view(np.uint8).reshape(-1)
        return np.unpackbits(words, bitorder="little")[: self.vocab].astype(bool)

    def accept(self, matcher, token):
        matcher.accept_token(token)

    def finished(self, matcher):
        return matcher.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer, vocab):
        import outlines_core

        self.oc, self.vocab = outlines_core, vocab
        pieces = {}
        for token, index in tokenizer.get_vocab().items():
            if index != tokenizer.eos_token_id:
                pieces.setdefault(tokenizer.convert_tokens_to_string([token]).encode(), []).append(index)
        self.vocabulary = outlines_core.Vocabulary(tokenizer.eos_token_id, pieces)

    def start(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def mask(self, guide):
        allowed = np.zeros(self.vocab, dtype=bool)
        allowed[guide.get_tokens()] = True
        return allowed

    def accept(self, guide, token):
        guide.advance(token)

    def finished(self, guide):
        return guide.is_finished()


ENGINES = {"llguidance": Llguidance, "xgrammar": Xgrammar, "outlines_core": OutlinesCore}


def walk(engine, schema, steps: int, seed: int) -> tuple:
    """(compile seconds, mean seconds per step's mask over the walk)."""
    started = time.perf_counter()
    matcher = engine.start(schema)
    compiled = time.perf_counter() - started
    rng, masks = np.random.default_rng(seed), []
    for _ in range(steps):
        started = time.perf_counter()
        allowed = engine.mask(matcher)
        masks.append(time.perf_counter() - started)
        if not allowed.any():
            break
        logits = np.where(allowed, rng.normal(size=engine.vocab), -np.inf)
        engine.accept(matcher, int(np.argmax(logits)))
        if engine.finished(matcher):
            break
    return compiled, statistics.mean(masks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    started = time.perf_counter()
    tokenizer = train_tokenizer(args.vocab)
    vocab = len(tokenizer)
    print(f"byte-level BPE of {vocab} tokens (trained in {time.perf_counter() - started:.0f} s); {args.steps} steps "
          "per schema; compile ms / mask us per step", flush=True)
    engines = []
    for module, kind in ENGINES.items():
        if importlib.util.find_spec(module) is None:
            print(f"{kind.name}: not installed, left out")
            continue
        started = time.perf_counter()
        engines.append(kind(tokenizer, vocab))
        print(f"{kind.name}: tokenizer read in {time.perf_counter() - started:.2f} s", flush=True)
    print("| schema | " + " | ".join(e.name for e in engines) + " |")
    print("|---|" + "---|" * len(engines))
    for name, schema in SCHEMAS.items():
        cells = []
        for engine in engines:
            try:
                compiled, step = walk(engine, schema, args.steps, seed=0)
                cells.append(f"{compiled * 1e3:.1f} ms / {step * 1e6:.0f} us")
            except Exception as error:  # noqa: BLE001 (a schema an engine refuses is a result here)
                cells.append(f"refused ({type(error).__name__}: {str(error).splitlines()[0][:60]})")
            sys.stdout.flush()
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
