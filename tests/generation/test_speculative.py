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
def checkpoints(tmp_path_factory):
    """(the target's checkpoint folder, a draft's: another random model of the same tokenizer)."""
    return tuple(llm.tiny_checkpoint(tmp_path_factory.mktemp("checkpoint"), seed=seed, max_cache=CONTEXT)
                 for seed in (0, 1))


@pytest.fixture(scope="module")
def pair(checkpoints, tmp_path_factory):
    """(the target's .pte, exported with the draft's checkpoint written into it, and so
    with verify; the draft's own .pte)."""
    paths = []
    for checkpoint, options in ((checkpoints[0], ["--draft", checkpoints[1]]), (checkpoints[1], [])):
        out = tmp_path_factory.mktemp("exported")
        assert main(["export-llm", checkpoint, "-o", str(out / "model.pte"), "--max-seq-len", str(CHUNK), *options]) == 0
        paths.append(out / "model.pte")
    return tuple(paths)


@pytest.fixture(scope="module")
def self_drafted(checkpoints, tmp_path_factory):
    """The target's .pte with a draft of its own first layer and head."""
    path = tmp_path_factory.mktemp("self_drafted") / "model.pte"
    etmlx.export_llm(checkpoints[0], path, max_seq_len=CHUNK, draft_layers=1)
    return path


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


def test_the_drafts_prefill_comes_before_the_first_token(pair):
    """Both models take in the prompt before the first token, as mlx-lm's prefill does:
    decode tokens/s then times drafting and checking, not the draft's prefill (a prompt
    length's compiled graph made on its second call took 0.7 s, inside the decode)."""
    target_path, draft_path = pair
    ids = generation.load_tokenizer(str(target_path.parent)).encode(PROMPT)
    target, draft = _session(target_path), _session(draft_path)
    stats = generation.Stats()
    steps = speculative.speculative_decode(target, draft, ids, 8, stats=stats, stop_at_eos=False)
    next(steps)
    assert (target.position, draft.position) == (len(ids), len(ids)) and stats.time_to_first_token > 0
    assert len(list(steps)) == 7


def test_a_draft_in_the_targets_file_has_methods_and_caches_of_its_own(pair, self_drafted):
    """``draft_forward`` and the runner's constants beside the target's methods, its KV
    caches named ``draft.*``; a draft of the target's first layer reads the weights the
    target stores (the file holds each once)."""
    from etmlx.inspection import inspect_program

    for path, layers in ((pair[0], 2), (self_drafted, 1)):
        methods = inspect_program(str(path))["methods"]
        assert {"forward", "verify", "draft_forward", "draft_get_max_context_len"} <= set(methods)
        (draft,), (forward,) = methods["draft_forward"]["delegates"], methods["forward"]["delegates"]
        caches = {b["name"] for b in draft["buffers"] if "key_cache" in b["name"] or "value_cache" in b["name"]}
        assert caches == {f"draft.cached.{kind}_cache_{i}" for kind in ("key", "value") for i in range(layers)}
        assert {"Sdpa", "IndexPut", "Rope"} <= set(draft["nodes"])
    methods = inspect_program(str(self_drafted))["methods"]
    (draft,), (forward,) = methods["draft_forward"]["delegates"], methods["forward"]["delegates"]
    assert {c["key"] for c in draft["constants"]} <= {c["key"] for c in forward["constants"]}
    assert [c["key"] for c in draft["constants"]] != [c["key"] for c in forward["constants"]]  # fewer layers


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_speculative_from_one_file_is_plain_greedy(pair, self_drafted, runtime):
    """One load: the target's methods and the draft's over caches of their own."""
    from etmlx.llm.draft import PREFIX

    ids = generation.load_tokenizer(str(pair[0].parent)).encode(PROMPT)
    plain = list(generation.generate_tokens(_session(pair[0], runtime), ids, 40, stop_at_eos=False))
    for path in (pair[0], self_drafted):
        target = _session(path, runtime)
        draft = generation.Session(target.program, prefix=PREFIX)
        assert draft.context == target.context and draft.limits["get_max_seq_len"] == CHUNK
        stats = generation.Stats()
        steps = speculative.speculative_decode(target, draft, ids, 40, k=3, stats=stats, stop_at_eos=False)
        assert [step.token for step in steps] == plain
        assert stats.draft_proposed > 0


def test_generate_and_chat_take_the_draft_in_the_file(self_drafted, capsys):
    from etmlx.llm.chat import Chat
    from etmlx.llm.cli import draft_session

    assert main(["generate", str(self_drafted), "--prompt", PROMPT, "--max-new-tokens", "24"]) == 0
    plain = capsys.readouterr().out
    assert main(["generate", str(self_drafted), "--prompt", PROMPT, "--max-new-tokens", "24", "--speculative"]) == 0
    out = capsys.readouterr()
    assert out.out == plain and "draft tokens accepted" in out.err
    tokenizer = generation.load_tokenizer(str(self_drafted.parent))
    target = _session(self_drafted)
    chats = (Chat(_session(self_drafted), tokenizer, max_new_tokens=12),
             Chat(target, tokenizer, max_new_tokens=12, draft=draft_session(self_drafted, target, speculative=True)))
    for text in ("hello", "how are you"):
        assert "".join(chats[1].reply(text)) == "".join(chats[0].reply(text))
        assert chats[1].stats.draft_proposed > 0


def test_a_file_without_a_draft_or_a_draft_that_cannot_be_is_one_clear_error(pair, checkpoints, tmp_path, capsys):
    from etmlx.errors import ExportError
    from etmlx.llm import draft

    assert main(["generate", str(pair[1]), "--prompt", "x", "--speculative"]) == 1
    assert "holds no draft: export it with export-llm --draft DIR or --draft-layers N" in capsys.readouterr().err
    with pytest.raises(ExportError, match="draft_layers=2: expected 1 to 1, fewer than the model's 2 layers"):
        etmlx.export_llm(checkpoints[0], tmp_path / "x.pte", draft_layers=2)
    shutil.copytree(checkpoints[1], tmp_path / "other")
    (tmp_path / "other" / "tokenizer.json").write_text("{}")
    with pytest.raises(ExportError, match="is not the target's tokenizer"):
        etmlx.export_llm(checkpoints[0], tmp_path / "x.pte", draft=tmp_path / "other")
    with pytest.raises(ExportError, match="draft and draft_layers"):
        etmlx.export_llm(checkpoints[0], tmp_path / "x.pte", draft=checkpoints[1], draft_layers=1)
    with pytest.raises(ExportError, match="the target's layers keep a recurrent state"):
        draft.refuse_recurrent(llm.tiny_hybrid("lfm2"), "target")


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


@pytest.mark.parametrize("drafting", ["its own file", "inside the target's"])
def test_serve_with_a_draft_answers_as_without(pair, drafting):
    """Greedy replies of a server that drafts equal a plain generation's; a request that
    asks for logprobs decodes without the draft."""
    from openai import OpenAI

    from servers import health, serving

    target, draft = pair
    ids = generation.load_tokenizer(str(target.parent)).encode(PROMPT)
    tokenizer = generation.load_tokenizer(str(target.parent))
    expected = tokenizer.decode(list(generation.generate_tokens(_session(target), ids, 24)), skip_special_tokens=True)
    options = ["--draft", str(draft)] if drafting == "its own file" else ["--speculative"]
    with serving(target, *options, "--num-draft-tokens", "3") as url:
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
