"""The host sampler of ``etmlx.llm.generation``: each filter keeps what transformers' logits
processors keep, and draws follow the filtered softmax (tested by frequency)."""

import numpy as np
import pytest

from etmlx.llm.generation import GenerationError, Sampler, Sampling

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5])


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _expected(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The distribution written out from the rules, independently of the sampler."""
    logits = LOGITS / temperature
    keep = np.ones(len(logits), bool)
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    if top_k:
        keep[order[top_k:]] = False
    p = _softmax(np.where(keep, logits, -np.inf))
    if top_p < 1:
        mass = 0.0
        for i in order:
            if mass >= top_p:
                keep[i] = False
            mass += p[i]
    if min_p:
        keep &= p >= min_p * p.max()
    return _softmax(np.where(keep, logits, -np.inf))


@pytest.mark.parametrize("settings", [
    dict(temperature=1.0), dict(temperature=0.5), dict(temperature=1.0, top_k=3), dict(temperature=1.0, top_p=0.6),
    dict(temperature=1.0, min_p=0.3), dict(temperature=2.0, top_k=5, top_p=0.8),
])
def test_draws_follow_the_filtered_softmax(settings):
    expected = _expected(**settings)
    sampler = Sampler(Sampling(seed=1, **settings))
    np.testing.assert_allclose(sampler.probabilities(LOGITS), expected, rtol=1e-12, atol=1e-15)
    draws = 40_000
    counts = np.bincount([sampler(LOGITS) for _ in range(draws)], minlength=len(LOGITS))
    assert counts[expected == 0].sum() == 0, "a filtered token was drawn"
    frequency = counts / draws
    bound = 5 * np.sqrt(expected * (1 - expected) / draws) + 1e-9  # five standard deviations
    assert np.all(np.abs(frequency - expected) <= bound), (frequency, expected)


def test_top_p_keeps_the_token_that_crosses_the_mass():
    """top_p 0.6: token 0 holds 0.33 and token 1 (the lower id of a tie) brings it to
    0.54, so token 7 is kept too (0.74), and nothing after it."""
    kept = np.flatnonzero(Sampler(Sampling(temperature=1.0, top_p=0.6)).probabilities(LOGITS))
    assert kept.tolist() == [0, 1, 7]


def test_greedy_and_the_repetition_penalty():
    sampler = Sampler(Sampling(temperature=0.0))
    assert sampler(LOGITS) == 0
    penalized = Sampler(Sampling(temperature=0.0, repetition_penalty=2.0))
    assert penalized(LOGITS, history=[0]) == 1  # 2.0 / 2 < 1.5: token 1 (the lower id of a tie) wins
    assert penalized.probabilities(-LOGITS, history=[6])[6] == 1.0  # a negative logit is multiplied: -(-3) stays max


def test_frequency_and_presence_penalties_follow_openais_rule():
    """A generated token's logit less frequency_penalty times its count, less
    presence_penalty once; the prompt's tokens are not counted."""
    sampling = Sampling(temperature=1.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = Sampler(sampling).probabilities(LOGITS, history=[1, 0, 0, 3], generated=[0, 0, 3])
    expected = LOGITS.copy()
    expected[0] -= 0.5 * 2 + 0.25
    expected[3] -= 0.5 * 1 + 0.25
    np.testing.assert_allclose(got, _softmax(expected), rtol=1e-12)
    assert Sampler(Sampling(temperature=0.0, presence_penalty=2.0))(LOGITS, generated=[0]) == 1


def test_a_mask_leaves_only_the_allowed_tokens():
    allowed = np.zeros(LOGITS.size, bool)
    allowed[[2, 5]] = True
    got = Sampler(Sampling(temperature=1.0)).probabilities(LOGITS, allowed=allowed)
    np.testing.assert_allclose(got, _softmax(np.where(allowed, LOGITS, -np.inf)), rtol=1e-12)
    assert Sampler(Sampling())(LOGITS, allowed=allowed) == 2
    with pytest.raises(GenerationError, match="allows no token"):
        Sampler(Sampling())(LOGITS, allowed=np.zeros(LOGITS.size, bool))


def test_a_seed_repeats_its_draws():
    first, second, other = (Sampler(Sampling(temperature=1.0, seed=seed)) for seed in (7, 7, 8))
    draws = [first(LOGITS) for _ in range(50)]
    assert draws == [second(LOGITS) for _ in range(50)] and draws != [other(LOGITS) for _ in range(50)]


@pytest.mark.parametrize("settings, message", [
    (dict(top_p=2), r"top_p=2: expected in \(0, 1\]"), (dict(top_p=0), "top_p=0"), (dict(temperature=-1), "temperature=-1"),
    (dict(top_k=-1), "top_k=-1"), (dict(min_p=1.0), "min_p=1.0"), (dict(repetition_penalty=0), "repetition_penalty=0"),
    (dict(temperature=float("nan")), "temperature=nan"), (dict(frequency_penalty=3), r"frequency_penalty=3: expected in \[-2, 2\]"),
    (dict(presence_penalty=-2.5), "presence_penalty=-2.5"),
])
def test_bad_settings_are_one_clear_error(settings, message):
    with pytest.raises(GenerationError, match=message):
        Sampling(**settings)
