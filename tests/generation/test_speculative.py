"""Speculative decoding (``etmlx.llm.speculative``): a target exported with ``verify``
checks a draft's tokens; greedy text is plain greedy decoding's whatever the draft
proposes, on both runtimes, and the acceptance rule keeps the target's distribution."""

import shutil

import numpy as np
import pytest

import etmlx
from etmlx.cli import main
from etmlx.llm import generation, speculative
from examples import llm

CONTEXT, CHUNK = 128, 8
PROMPT = "hello world, the quick brown fox"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(the target's .pte, exported with verify; a draft's, another random model of the
    same tokenizer)."""
    paths = []
    for seed, options in ((0, ["--verify"]), (1, [])):
        checkpoint = llm.tiny_checkpoint(tmp_path_factory.mktemp("checkpoint"), seed=seed, max_cache=CONTEXT)
        out = tmp_path_factory.mktemp("exported")
        assert main(["export-llm", checkpoint, "-o", str(out / "model.pte"), "--max-seq-len", str(CHUNK), *options]) == 0
        paths.append(out / "model.pte")
    return tuple(paths)


def _session(path, runtime="python"):
    return generation.Session(etmlx.load(path, runtime=runtime))


def test_verify_is_forward_whole_on_mlx_over_the_same_cache(pair):
    """One delegate beside the same host reads of the position as forward's, the same
    cache buffers, the same kinds of node but the last position's selection."""
    from etmlx.inspection import inspect_program

    methods = inspect_program(str(pair[0]))["methods"]
    (forward,), (verify,) = methods["forward"]["delegates"], methods["verify"]["delegates"]
    assert methods["verify"]["kernels"] == methods["forward"]["kernels"]
    assert [(b["name"], b["key"]) for b in verify["buffers"]] == [(b["name"], b["key"]) for b in forward["buffers"]]
    assert {"Sdpa", "IndexPut", "Rope"} <= set(verify["nodes"]) and set(verify["nodes"]) <= set(forward["nodes"])
    assert methods["verify"]["outputs"][0]["sizes"] == [1, CHUNK, 128]
    assert "verify" not in inspect_program(str(pair[1]))["methods"]  # only where asked for


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_verify_returns_every_positions_logits(pair, runtime):
    target = _session(pair[0], runtime)
    ids = generation.load_tokenizer(str(pair[0].parent)).encode(PROMPT)[:CHUNK]
    rows = target.verify(ids)
    stepwise = _session(pair[0], runtime)
    expected = [stepwise.feed([token]) for token in ids]
    np.testing.assert_allclose(rows, np.stack(expected), rtol=1e-4, atol=1e-4)
    assert rows.shape == (len(ids), 128)


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_greedy_text_is_plain_greedys_whatever_the_draft(pair, runtime):
    target_path, draft_path = pair
    ids = generation.load_tokenizer(str(target_path.parent)).encode(PROMPT)
    plain = list(generation.generate_tokens(_session(target_path, runtime), ids, 48, stop_at_eos=False))
    for draft, k in ((draft_path, 3), (target_path, 4), (target_path, CHUNK - 1)):  # another model; the target itself
        stats = generation.Stats()
        steps = speculative.speculative_decode(_session(target_path, runtime), _session(draft, runtime), ids, 48,
                                               k=k, stats=stats, stop_at_eos=False)
        assert [step.token for step in steps] == plain
        assert stats.draft_proposed > 0
        if draft == target_path:  # it agrees with itself: every proposal kept, k + 1 tokens per target call
            assert stats.draft_accepted == stats.draft_proposed >= 30


def test_the_acceptance_rule_keeps_the_targets_distribution():
    """Drafted from q, accepted by the rule: the first token follows the target's p, on a
    vocabulary of 4, whatever q is (20000 draws; 4 standard deviations)."""
    rng = np.random.default_rng(0)
    p = np.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
    q = np.array([[0.1, 0.1, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25], [0.9, 0.05, 0.05, 0.0]])
    firsts = []
    for _ in range(20000):
        drafted = [int(rng.choice(4, p=row)) for row in q]
        kept, after = speculative.accept(p, q, drafted, rng.random)
        firsts.append(drafted[0] if kept else after)
    frequency = np.bincount(firsts, minlength=4) / len(firsts)
    assert np.abs(frequency - p[0]).max() < 4 * np.sqrt(0.25 / 20000)
    greedy_p, greedy_q = np.eye(4)[[1, 2, 3, 0]], np.eye(4)[[1, 2, 0]]
    assert speculative.accept(greedy_p, greedy_q, [1, 2, 0], rng.random) == (2, 3)  # the target's argmax at the miss


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_chat_with_a_draft_replies_as_without_and_keeps_both_caches(pair, runtime):
    from etmlx.llm.chat import Chat

    target, draft = pair
    tokenizer = generation.load_tokenizer(str(target.parent))
    plain = Chat(_session(target, runtime), tokenizer, max_new_tokens=16)
    drafted = Chat(_session(target, runtime), tokenizer, max_new_tokens=16, draft=_session(draft, runtime),
                   num_draft_tokens=3)
    for text in ("hello", "how are you", "the quick brown fox"):
        assert "".join(drafted.reply(text)) == "".join(plain.reply(text))
        assert drafted.stats.draft_proposed > 0
    assert drafted.fed_from == plain.fed_from > 0  # the last turn fed only its own message
    assert len(drafted.draft_cached) > drafted.fed_from  # and the draft's cache carried too


def test_generate_with_a_draft_prints_the_same_text(pair, capsys):
    target, draft = pair
    assert main(["generate", str(target), "--prompt", PROMPT, "--max-new-tokens", "24"]) == 0
    plain = capsys.readouterr().out
    assert main(["generate", str(target), "--prompt", PROMPT, "--max-new-tokens", "24", "--draft", str(draft),
                 "--num-draft-tokens", "3"]) == 0
    out = capsys.readouterr()
    assert out.out == plain and "draft tokens accepted" in out.err


def test_serve_with_a_draft_answers_as_without(pair):
    """Greedy replies of a server that drafts equal a plain generation's; a request that
    asks for logprobs decodes without the draft."""
    from openai import OpenAI

    from servers import health, serving

    target, draft = pair
    ids = generation.load_tokenizer(str(target.parent)).encode(PROMPT)
    tokenizer = generation.load_tokenizer(str(target.parent))
    expected = tokenizer.decode(list(generation.generate_tokens(_session(target), ids, 24)), skip_special_tokens=True)
    with serving(target, "--draft", str(draft), "--num-draft-tokens", "3") as url:
        client = OpenAI(base_url=url, api_key="unused", max_retries=0)
        for logprobs in (None, 1):
            reply = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, logprobs=logprobs)
            assert reply.choices[0].text == expected
        counts = health(url)
        assert counts["draft_proposed"] > 0 and counts["requests"] == 2


@pytest.mark.parametrize("change, message", [
    (lambda t, d: None, "no verify method"),
    (lambda t, d: d.limits.update(get_vocab_size=99), "the draft's vocabulary of 99 tokens is not the target's 128"),
    (lambda t, d: d.limits.update(get_eos_ids=[7]), "end-of-sequence ids [7]"),
    (lambda t, d: d.limits.update(get_max_context_len=64), "the draft's context of 64 tokens is shorter"),
    (lambda t, d: d.limits.update(use_recurrent_state=True), "the draft's layers keep a recurrent state"),
])
def test_a_draft_that_cannot_draft_is_one_clear_error(pair, change, message):
    target, draft = (_session(path) for path in ((pair[1] if "verify" in message else pair[0]), pair[1]))
    change(target, draft)
    with pytest.raises(generation.GenerationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        next(speculative.speculative_decode(target, draft, [1, 2, 3], 4))


@pytest.mark.parametrize("k", [0, CHUNK, True])
def test_the_number_of_draft_tokens_is_checked(pair, k):
    with pytest.raises(generation.GenerationError, match=f"num_draft_tokens={k!r}: expected 1 to {CHUNK - 1}"):
        next(speculative.speculative_decode(_session(pair[0]), _session(pair[1]), [1, 2, 3], 4, k=k))


def test_a_draft_of_another_tokenizer_is_refused(pair, tmp_path, capsys):
    target, draft = pair
    shutil.copytree(draft.parent, tmp_path / "draft")
    (tmp_path / "draft" / "tokenizer.json").write_text("{}")
    assert main(["generate", str(target), "--prompt", "x", "--draft", str(tmp_path / "draft" / "model.pte")]) == 1
    assert "is not the target's tokenizer" in capsys.readouterr().err
