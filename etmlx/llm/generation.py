"""Text generation with a program exported by ``etmlx.llm.causal_lm`` (or any ``.pte`` in
ExecuTorch's LLM-runner convention: ``forward(tokens [1, n], cache_position [n]) ->
logits [1, vocab]`` and the runner's constant methods), on either runtime.

``decode`` streams the steps of a generation, each token with the logits it was drawn
from: the prompt prefilled in chunks of the file's ``get_max_seq_len``, then one token
per call, sampled on the host from the last position's logits (``Sampler``), within
what a ``constraint`` (a grammar) allows. ``generate_tokens`` streams their token ids,
``generate`` their text through a tokenizer. All
need only numpy besides the runtime, and keep the KV cache of the loaded program: a
later call with ``start`` continues the same conversation.
"""

import math
import resource
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from etmlx.errors import EtMlxError
from .causal_lm import RECURRENT_STATE_METHOD, metadata


class GenerationError(EtMlxError, ValueError):
    """A generation request that cannot be served: bad sampling settings, a prompt past
    the context, a program that is not a language model."""


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen from the logits, in this order: ``repetition_penalty``
    (transformers' rule: a seen token's logit divided by it when positive, multiplied
    when negative), ``frequency_penalty`` and ``presence_penalty`` (OpenAI's rule: a
    generated token's logit less the first times its count, less the second once), then
    ``temperature`` (0: greedy, the rest is ignored), ``top_k``
    (0: off), ``top_p`` (1: off) and ``min_p`` (0: off: tokens below ``min_p`` times the
    likeliest's probability are dropped); ``seed`` makes the draws repeatable."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self):
        checks = [
            ("temperature", self.temperature, _finite(self.temperature) and self.temperature >= 0, "0 or more"),
            ("top_k", self.top_k, isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0,
             "a whole number, 0 or more"),
            ("top_p", self.top_p, _finite(self.top_p) and 0 < self.top_p <= 1, "in (0, 1]"),
            ("min_p", self.min_p, _finite(self.min_p) and 0 <= self.min_p < 1, "in [0, 1)"),
            ("repetition_penalty", self.repetition_penalty, _finite(self.repetition_penalty) and self.repetition_penalty > 0,
             "more than 0"),
            ("frequency_penalty", self.frequency_penalty, _finite(self.frequency_penalty)
             and -2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
            ("presence_penalty", self.presence_penalty, _finite(self.presence_penalty)
             and -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
        ]
        for name, value, valid, expected in checks:
            if not valid:
                raise GenerationError(f"{name}={value!r}: expected {expected}")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Sampler:
    """Draws token ids by ``Sampling``'s rules from one position's logits."""

    def __init__(self, sampling: Sampling):
        self.sampling = sampling
        self.random = np.random.default_rng(sampling.seed)

    @property
    def penalizes(self) -> bool:
        s = self.sampling
        return s.repetition_penalty != 1 or s.frequency_penalty != 0 or s.presence_penalty != 0

    def probabilities(self, logits, history=(), generated=(), allowed=None) -> np.ndarray:
        """The distribution a draw follows (float64; zero for every filtered token):
        ``history`` is every token so far (the prompt's too), ``generated`` the tokens
        generated so far, ``allowed`` None or a bool per token (a grammar's mask)."""
        s = self.sampling
        logits = np.array(logits, dtype=np.float64).reshape(-1)
        if s.repetition_penalty != 1 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            logits[seen] = np.where(logits[seen] > 0, logits[seen] / s.repetition_penalty, logits[seen] * s.repetition_penalty)
        if (s.frequency_penalty or s.presence_penalty) and len(generated):
            seen, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
            logits[seen] -= s.frequency_penalty * counts + s.presence_penalty
        if allowed is not None:
            if not allowed.any():
                raise GenerationError("the constraint allows no token here")
            logits[~allowed] = -np.inf
        if s.temperature == 0:
            probabilities = np.zeros_like(logits)
            probabilities[int(np.argmax(logits))] = 1.0
            return probabilities
        logits = logits / s.temperature
        order = np.argsort(-logits, kind="stable")  # likeliest first, ties by lower id
        keep = np.ones(logits.size, dtype=bool)
        if s.top_k:
            keep[order[s.top_k:]] = False
        probabilities = _softmax(np.where(keep, logits, -np.inf))
        if s.top_p < 1:
            ranked = probabilities[order]
            before = np.cumsum(ranked) - ranked  # mass of the likelier tokens
            keep[order[before >= s.top_p]] = False
        if s.min_p:
            keep &= probabilities >= s.min_p * probabilities.max()
        return _softmax(np.where(keep, logits, -np.inf))

    def __call__(self, logits, history=(), generated=(), allowed=None) -> int:
        probabilities = self.probabilities(logits, history, generated, allowed)
        if self.sampling.temperature == 0:
            return int(np.argmax(probabilities))
        return self.draw(probabilities, self.random.random())

    @staticmethod
    def draw(probabilities: np.ndarray, uniform: float) -> int:
        """The token at ``uniform`` of the distribution's CDF over the tokens likeliest
        first (ties by lower id): the order the delegate's sampler draws in
        (``windowed_cache.SampledCausalLM``), so one number picks one token in both."""
        order = np.argsort(-probabilities, kind="stable")
        cumulative = np.cumsum(probabilities[order])
        return int(order[min(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"), order.size - 1)])


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


@dataclass
class Stats:
    """What one generation did; times in seconds, rates in tokens per second."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    time_to_first_token: float = 0.0
    decode_seconds: float = 0.0
    peak_memory_mib: float = 0.0
    stop_reason: str = ""  # "eos", "stop string", "max_new_tokens", "context" or "constraint"
    cached_tokens: int = 0  # of the prompt, held by the cache already (decode_after): not fed
    draft_proposed: int = 0  # speculative decoding: tokens the draft proposed, and those the target kept
    draft_accepted: int = 0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.time_to_first_token if self.time_to_first_token else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        decoded = self.generated_tokens - 1  # the first token came from the prefill
        return decoded / self.decode_seconds if decoded > 0 and self.decode_seconds else 0.0

    def summary(self) -> str:
        return (f"prompt {self.prompt_tokens} tokens, generated {self.generated_tokens} ({self.stop_reason}); "
                f"time to first token {self.time_to_first_token * 1e3:.1f} ms, prefill {self.prefill_tokens_per_s:.1f} "
                f"tokens/s, decode {self.decode_tokens_per_s:.1f} tokens/s; peak memory {self.peak_memory_mib:.0f} MiB"
                + (f"; draft tokens accepted {self.draft_accepted}/{self.draft_proposed}" if self.draft_proposed else ""))


@dataclass
class Session:
    """A loaded program and what its KV cache holds: ``position`` tokens so far.
    ``prefix``: the session runs the methods named ``{prefix}_forward``, ... (a draft
    written into its target's file: ``etmlx.llm.draft``), over caches of their own."""

    program: object
    limits: dict = field(default_factory=dict)
    position: int = 0
    # Image features for the prompt's placeholder tokens (etmlx.multimodal.images.PromptImages)
    images: object = None
    prefix: str = ""

    def __post_init__(self):
        what = f"a {self.prefix}" if self.prefix else "it"
        if self._name("forward") not in self.program.method_names:
            raise GenerationError(f"this program has no {self._name('forward')} method: export {what} with "
                                  "etmlx.llm.causal_lm (etmlx export-llm)")
        self.limits = metadata(self.program, self._name(""))
        for name in ("get_max_seq_len", "get_max_context_len"):
            if name not in self.limits:
                raise GenerationError(f"this program has no {self._name(name)}: export {what} with "
                                      "etmlx.llm.causal_lm (etmlx export-llm)")

    def _name(self, method: str) -> str:
        return f"{self.prefix}_{method}" if self.prefix else method

    @property
    def context(self) -> int:
        return self.limits["get_max_context_len"]

    @property
    def eos_ids(self) -> set:
        return set(self.limits.get("get_eos_ids", []))

    def rewind(self, position: int) -> int:
        """Makes the cache hold only its first ``position`` tokens (the next call writes
        over the rest); returns where it resumes. A program whose layers keep a recurrent
        state (Qwen3.5, LFM2) cannot go back: that state has taken in every token fed, so
        short of the current position it resumes at 0, to prefill again."""
        if position < self.position and self.limits.get(RECURRENT_STATE_METHOD):
            position = 0
        self.position = position
        return position

    @property
    def samples_on_device(self) -> bool:
        """Whether the file has ``sample`` (``causal_lm.export_methods(sample_on_device=True)``)."""
        return self._name("sample") in self.program.method_names

    def feed(self, tokens: list) -> np.ndarray:
        """Runs ``tokens`` at the next positions, in chunks of the file's longest call; the
        last position's logits."""
        self._check_room(len(tokens))
        for start, end in self._chunks(len(tokens)):
            piece = tokens[start:end]
            if self.images is not None and self.images.placed_in(self.position, piece):
                logits = self.images.feed(self, piece)
            else:
                logits = self._call(self._name("forward"), piece)
        return _float_logits(logits).reshape(-1)

    def sample(self, tokens: list, sampling: Sampling, uniform: float) -> int:
        """``feed``, with the last chunk run by the file's ``sample``: the next token drawn
        inside the delegate by ``sampling``'s rules at ``uniform``."""
        self._check_room(len(tokens))
        last = self._chunks(len(tokens))[-1][0]
        if last:
            self.feed(tokens[:last])
        settings = [np.array([v], dtype=t) for v, t in ((sampling.temperature, np.float32), (sampling.top_k, np.int64),
                    (sampling.top_p, np.float32), (sampling.min_p, np.float32), (uniform, np.float32))]
        return int(np.asarray(self._call(self._name("sample"), tokens[last:], *settings)).reshape(-1)[0])

    def verify(self, tokens: list) -> np.ndarray:
        """Runs ``tokens`` (at most ``get_max_seq_len``) at the next positions through the
        file's ``verify``; every position's logits, [n, vocab]."""
        if self._name("verify") not in self.program.method_names:
            raise GenerationError("this program has no verify method: export the target with --verify (etmlx "
                                  "export-llm) to decode speculatively")
        self._check_room(len(tokens))
        return _float_logits(self._call(self._name("verify"), tokens)).reshape(len(tokens), -1)

    def _chunks(self, count: int) -> list:
        """``(start, end)`` of the calls that run ``count`` tokens from the next position:
        the file's longest call each, but none ending inside a prompt image's placeholders
        (an image comes whole in one call, as ExecuTorch's MultimodalRunner gives it: a
        model whose image tokens see their whole image needs it so)."""
        longest, chunks, start = self.limits["get_max_seq_len"], [], 0
        while start < count:
            end = min(start + longest, count)
            if self.images is not None:
                end = self.images.chunk_end(self.position + start, self.position + end) - self.position
            chunks.append((start, end))
            start = end
        return chunks

    def _check_room(self, count: int) -> None:
        if self.position + count > self.context:
            held = f" after the {self.position} the cache holds" if self.position else ""
            raise GenerationError(f"the prompt's {count} tokens{held} are past the context of {self.context} "
                                  "tokens (export with a larger --max-context)")

    def _call(self, method: str, tokens: list, *settings):
        return self.run_at_next_positions(method, np.asarray([tokens], dtype=np.int64), len(tokens), *settings)

    def run_at_next_positions(self, method: str, first, count: int, *settings):
        """``method(first, the next count positions, *settings)``'s output; the cache
        then holds ``count`` more. ``first``: the call's ids, or its embeddings."""
        positions = np.arange(self.position, self.position + count, dtype=np.int64)
        out = self.program.run_method(method, [first, positions, *settings])[0]
        self.position += count
        return out


def _float_logits(output) -> np.ndarray:
    """A method's logits as numpy; refused unless floating point: a file exported before
    etmlx returned float32 logits gives a bfloat16 model's as their 16-bit patterns, whose
    argmax would be a wrong token."""
    logits = np.asarray(output)
    if not np.issubdtype(logits.dtype, np.floating):
        raise GenerationError(f"the file's logits come as {logits.dtype} (bfloat16 bits, from an older etmlx): "
                              "export it again")
    return logits


@dataclass(frozen=True)
class Step:
    """One generated token, and the logits (one per vocabulary entry) it was drawn
    from: None where the delegate drew it (``Session.sample``)."""

    token: int
    logits: np.ndarray | None


def decode(session: Session, prompt: list, max_new_tokens: int, sampling: Sampling = Sampling(),
           stats: Stats | None = None, stop_at_eos: bool = True, constraint=None, logits: bool = False):
    """Yields up to ``max_new_tokens`` ``Step``s after ``prompt`` (ids), continuing
    ``session``'s cache; stops after an EOS id of the file (unless not ``stop_at_eos``),
    at the context's end, or where ``constraint`` is ``finished``. ``constraint`` (a
    grammar: ``grammar.Constraint``) says which tokens may come next (``allowed(vocab)``:
    a bool per token) and is told each one drawn (``accept``). ``logits``: every step
    carries its logits (so none is drawn in the delegate)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens={max_new_tokens!r}: expected a whole number, 0 or more")
    if not prompt:
        raise GenerationError("the prompt holds no tokens")
    stats = stats if stats is not None else Stats()
    sampler, history, generated = Sampler(sampling), list(prompt), []
    on_device = (session.samples_on_device and sampling.temperature > 0 and not sampler.penalizes
                 and constraint is None and not logits)

    def next_step(tokens: list) -> Step:
        """The token after ``tokens``, fed: drawn in the delegate where the file samples
        there (one random stream with the host sampler's), else on the host."""
        if on_device:
            return Step(session.sample(tokens, sampling, sampler.random.random()), None)
        out = session.feed(tokens)
        allowed = constraint.allowed(out.size) if constraint is not None else None
        return Step(sampler(out, history, generated, allowed), out)

    stats.prompt_tokens, stats.stop_reason = len(prompt), "max_new_tokens"
    started = time.perf_counter()
    step = next_step(list(prompt))
    stats.time_to_first_token = time.perf_counter() - started
    decoding = time.perf_counter()
    for produced in range(max_new_tokens):
        history.append(step.token)
        generated.append(step.token)
        if constraint is not None:
            constraint.accept(step.token)
        stats.generated_tokens = produced + 1
        stats.decode_seconds = time.perf_counter() - decoding
        stats.peak_memory_mib = peak_rss_mib()
        yield step
        if stop_at_eos and step.token in session.eos_ids:
            stats.stop_reason = "eos"
            return
        if constraint is not None and constraint.finished:
            stats.stop_reason = "constraint"
            return
        if produced + 1 == max_new_tokens:
            return
        if session.position >= session.context:
            stats.stop_reason = "context"
            return
        step = next_step([step.token])


def decode_after(session: Session, held: list, ids: list, max_new_tokens: int, sampling: Sampling = Sampling(),
                 stats: Stats | None = None, **options):
    """``decode`` after ``ids`` (a whole context, from position 0) where ``session``'s
    cache holds ``held`` (ids, from position 0): only what follows their common prefix
    is fed (at least the last id, for its logits); the slots past it are overwritten
    before attention reads them, and a recurrent state or a sliding window's ring that
    cannot go back that far starts over. ``stats.cached_tokens``: the ids not fed."""
    from etmlx.runtime_shim.errors import IndexRangeError

    stats = stats if stats is not None else Stats()
    start, produced = session.rewind(common_prefix(held, ids[:-1])), 0

    def steps_from(start):
        nonlocal produced
        stats.cached_tokens = start
        for step in decode(session, ids[start:], max_new_tokens, sampling, stats, **options):
            produced += 1
            yield step

    try:
        yield from steps_from(start)
    except IndexRangeError:
        if start == 0 or produced:
            raise
        session.position = 0  # the ring of a sliding-window layer (etmlx.llm.sliding_cache)
        yield from steps_from(0)


def common_prefix(a: list, b: list) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def generate_tokens(session: Session, prompt: list, max_new_tokens: int, sampling: Sampling = Sampling(),
                    stats: Stats | None = None, stop_at_eos: bool = True):
    """The token ids of ``decode``'s steps."""
    for step in decode(session, prompt, max_new_tokens, sampling, stats, stop_at_eos):
        yield step.token


def peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20 if sys.platform == "darwin" else 1 << 10)


def generate(session: Session, tokenizer, prompt: str, max_new_tokens: int = 128, sampling: Sampling = Sampling(),
             stop: tuple = (), stats: Stats | None = None, add_special_tokens: bool = True):
    """Yields the text generated after ``prompt`` as it is made (``stream_text``);
    ``tokenizer`` is a transformers tokenizer (``load_tokenizer``)."""
    stats = stats if stats is not None else Stats()
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    yield from stream_text(tokenizer, generate_tokens(session, prompt_ids, max_new_tokens, sampling, stats), stop, stats,
                           session.eos_ids)


def stream_text(tokenizer, tokens, stop: tuple = (), stats: Stats | None = None, eos=()):
    """The text of ``tokens`` (an iterator of ids, ending at an id in ``eos``) piece by
    piece: a piece is held back while it ends inside a UTF-8 character or could begin a
    ``stop`` string; a stop string ends the text and is not yielded."""
    ids, shown = [], ""
    for token in tokens:
        if token in eos:  # the tokens' generator, left waiting at its yield, does not say so itself
            if stats is not None:
                stats.stop_reason = "eos"
            break
        ids.append(token)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s, max(len(shown) - len(s), 0)) for s in stop) if i >= 0), default=-1)
        if cut >= 0:
            if stats is not None:
                stats.stop_reason = "stop string"
            if cut > len(shown):
                yield text[len(shown):cut]
            return
        ready = len(text) - held_back(text, stop)
        if ready > len(shown):
            yield text[len(shown):ready]
            shown = text[:ready]
    text = tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
    if len(text) > len(shown):
        yield text[len(shown):]


def load_tokenizer(path):
    """The tokenizer of an exported model: a folder holding ``tokenizer.json`` (and
    ``tokenizer_config.json``, with the chat template), or a ``tokenizer.json`` itself."""
    import os

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if os.path.isdir(path) and os.path.exists(os.path.join(path, "tokenizer_config.json")):
        return AutoTokenizer.from_pretrained(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise GenerationError(f"no tokenizer at {path}: expected tokenizer.json (etmlx export-llm copies it beside the .pte)")
    return PreTrainedTokenizerFast(tokenizer_file=file)


def held_back(text: str, stop: tuple) -> int:
    """How many trailing characters may still change or begin a stop string."""
    held = 1 if text.endswith("\ufffd") else 0
    for s in stop:
        for length in range(min(len(s) - 1, len(text)), 0, -1):
            if s.startswith(text[-length:]):
                held = max(held, length)
                break
    return held
