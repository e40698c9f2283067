"""Speculative decoding: a draft model proposes up to ``k`` tokens, one call each; the
target checks them all in one call of its ``verify`` method (every position's logits,
``export-llm --verify``); both caches then go back past the first token the target
rejects. Decoding is bound by reading the weights, so the target's one call for k + 1
tokens costs about what its call for one does.

Each drafted token is accepted with probability min(1, p / q) (p the target's
probability of it, q the draft's, each by the request's ``Sampling`` rules); at the first
rejection the token is drawn from max(0, p - q), renormalized, and after k acceptances a
last one from the target's next distribution (Leviathan et al., 2023): the text follows
the target's distribution exactly. Greedy, p and q are one-hot, so a drafted token is
kept where it is the target's argmax and the text is plain greedy decoding's.

Both models must share the tokenizer; models whose layers keep a recurrent state cannot
go back past a rejected token and are refused.
"""

import time

import numpy as np

from .causal_lm import RECURRENT_STATE_METHOD
from .generation import GenerationError, Sampler, Sampling, Session, Stats, Step, common_prefix, peak_rss_mib


def check_pair(target: Session, draft: Session, k: int) -> None:
    """One GenerationError naming why ``draft`` cannot draft ``k`` tokens for ``target``."""
    if "verify" not in target.program.method_names:
        raise GenerationError("the target has no verify method: export it with --verify (etmlx export-llm) to "
                              "decode speculatively")
    for name, session in (("target", target), ("draft", draft)):
        if session.limits.get(RECURRENT_STATE_METHOD):
            raise GenerationError(f"the {name}'s layers keep a recurrent state, which cannot go back past a rejected "
                                  "token: speculative decoding needs attention caches")
    vocab = (target.limits.get("get_vocab_size"), draft.limits.get("get_vocab_size"))
    if vocab[0] != vocab[1]:
        raise GenerationError(f"the draft's vocabulary of {vocab[1]} tokens is not the target's {vocab[0]}: a draft "
                              "must share the target's tokenizer")
    if target.eos_ids != draft.eos_ids:
        raise GenerationError(f"the draft's end-of-sequence ids {sorted(draft.eos_ids)} are not the target's "
                              f"{sorted(target.eos_ids)}: a draft must share the target's tokenizer")
    most = target.limits["get_max_seq_len"] - 1
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= most:
        raise GenerationError(f"num_draft_tokens={k!r}: expected 1 to {most} (the target checks k + 1 tokens in one "
                              f"call, at most its max_seq_len of {most + 1})")
    if draft.context < target.context:
        raise GenerationError(f"the draft's context of {draft.context} tokens is shorter than the target's "
                              f"{target.context}: export the draft with --max-context {target.context}")


def accept(target_rows: np.ndarray, draft_rows: np.ndarray, drafted: list, random) -> tuple:
    """(how many of ``drafted`` are kept, the token after them): ``target_rows`` are the
    target's k + 1 distributions (after each of the fed tokens), ``draft_rows`` the k the
    drafted tokens were drawn from; ``random()`` a number in [0, 1)."""
    for i, token in enumerate(drafted):
        p, q = target_rows[i][token], draft_rows[i][token]
        if q > 0 and random() < p / q:
            continue
        residual = np.maximum(target_rows[i] - draft_rows[i], 0.0)
        rest = residual if residual.sum() > 0 else target_rows[i]
        return i, Sampler.draw(rest / rest.sum(), random())
    return len(drafted), Sampler.draw(target_rows[len(drafted)], random())


def speculative_decode(target: Session, draft: Session, prompt: list, max_new_tokens: int,
                       sampling: Sampling = Sampling(), k: int = 4, stats: Stats | None = None,
                       stop_at_eos: bool = True, held: tuple = ((), ())):
    """Yields up to ``max_new_tokens`` ``Step``s after ``prompt`` (ids: the whole context,
    from position 0), as ``generation.decode`` does, with ``draft`` proposing ``k`` tokens
    at a time for ``target`` to check. ``held``: the ids the target's and the draft's
    caches hold (``etmlx chat``'s conversation so far): only what follows the prefix they
    share with ``prompt`` is fed. ``stats.draft_proposed`` and ``stats.draft_accepted``
    count the drafted tokens; ``stats.cached_tokens`` the target's prompt ids not fed."""
    check_pair(target, draft, k)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens={max_new_tokens!r}: expected a whole number, 0 or more")
    if not prompt:
        raise GenerationError("the prompt holds no tokens")
    stats = stats if stats is not None else Stats()
    sampler = Sampler(sampling)
    random = sampler.random.random
    history, start = list(prompt), len(prompt)
    fed_from = target.rewind(common_prefix(list(held[0]), history[:-1]))
    pending = history[draft.rewind(common_prefix(list(held[1]), history)):]  # what the draft has not fed, before ``token``

    def distribution(logits, drafted=()):
        """The next token's distribution after ``history`` and ``drafted`` (the token
        lists built only for a penalty that reads them)."""
        if not sampler.penalizes:
            return sampler.probabilities(logits)
        return sampler.probabilities(logits, history + list(drafted), history[start:] + list(drafted))

    def drawn(probabilities) -> int:
        return int(np.argmax(probabilities)) if sampling.temperature == 0 else Sampler.draw(probabilities, random())

    stats.prompt_tokens, stats.stop_reason = start - fed_from, "max_new_tokens"  # fed, as decode counts them
    started = time.perf_counter()
    stats.cached_tokens = fed_from
    token = drawn(distribution(target.feed(history[fed_from:])))
    if pending and max_new_tokens > 1:  # the draft's prefill belongs to the prompt, as the target's does
        draft.feed(pending)
        pending = []
    stats.time_to_first_token = time.perf_counter() - started
    decoding, produced = time.perf_counter(), 0
    while max_new_tokens:
        for emitted in [token] if produced == 0 else round_tokens:
            history.append(emitted)
            produced += 1
            stats.generated_tokens, stats.decode_seconds = produced, time.perf_counter() - decoding
            stats.peak_memory_mib = peak_rss_mib()
            yield Step(emitted, None)
            if stop_at_eos and emitted in target.eos_ids:
                stats.stop_reason = "eos"
                return
            if produced == max_new_tokens:
                return
        if target.position >= target.context:
            stats.stop_reason = "context"
            return
        room = min(k, max_new_tokens - produced - 1, target.context - target.position - 1,
                   draft.context - draft.position - len(pending) - 1)
        if room < 1:  # too near the end to draft: one plain step
            pending.append(token)
            token = drawn(distribution(target.feed([token])))
            round_tokens = [token]
            continue
        base, fed, drafted, draft_rows = target.position, pending + [token], [], []
        for _ in range(room):
            draft_rows.append(distribution(draft.feed(fed), drafted))
            drafted.append(drawn(draft_rows[-1]))
            fed = drafted[-1:]
        rows = target.verify([token] + drafted)
        target_rows = np.stack([distribution(rows[i], drafted[:i]) for i in range(room + 1)])
        kept, token = accept(target_rows, np.stack(draft_rows), drafted, random)
        stats.draft_proposed += room
        stats.draft_accepted += kept
        target.rewind(base + 1 + kept)
        if kept == room:  # the draft never fed its last proposal
            pending = drafted[-1:]
        else:
            draft.rewind(base + 1 + kept)
            pending = []
        round_tokens = drafted[:kept] + [token]
