"""A Hugging Face checkpoint folder to text: ``etmlx export-llm``, then ``etmlx.generate``
/ ``etmlx generate`` / ``etmlx chat`` on both runtimes and ExecuTorch's own
``TextLLMRunner``, each against transformers' eager greedy text. Nothing is downloaded:
the checkpoint is written by ``save_pretrained``, its tokenizer trained here."""

import re

import pytest

import etmlx
from etmlx.llm import generation
from etmlx.cli import main
from etmlx.errors import ExportError
from etmlx.inspection import constant_methods
from examples import llm

CONTEXT, CHUNK = 128, 8
PROMPT = "hello world, the quick brown fox jumps over the lazy dog"  # more tokens than one chunk


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    checkpoint = llm.tiny_checkpoint(tmp_path_factory.mktemp("checkpoint"), max_cache=CONTEXT)
    out = tmp_path_factory.mktemp("exported")
    assert main(["export-llm", checkpoint, "-o", str(out / "model.pte"), "--max-seq-len", str(CHUNK)]) == 0
    model = llm.with_static_cache(AutoModelForCausalLM.from_pretrained(checkpoint), CONTEXT)
    return out / "model.pte", model, generation.load_tokenizer(str(out))


def eager_text(model, tokenizer, ids: list, new_tokens: int) -> str:
    """transformers' greedy continuation of ``ids``, up to its first EOS, as text."""
    generated = llm.eager_greedy(model, ids, new_tokens)[len(ids):]
    eos = model.config.eos_token_id
    return tokenizer.decode(generated[: generated.index(eos)] if eos in generated else generated, skip_special_tokens=True)


def test_export_llm_writes_the_runner_form_and_the_tokenizer(exported):
    path, _, _ = exported
    assert constant_methods(path)["get_max_seq_len"] == [CHUNK]
    assert constant_methods(path)["get_max_context_len"] == [CONTEXT]
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in path.parent.iterdir()}


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_greedy_text_equals_eager_with_a_chunked_prompt(exported, runtime):
    path, model, tokenizer = exported
    ids = tokenizer.encode(PROMPT)
    assert len(ids) > CHUNK
    stats = generation.Stats()
    session = generation.Session(etmlx.load(path, runtime=runtime))
    text = "".join(generation.generate(session, tokenizer, PROMPT, 24, stats=stats))
    assert text == eager_text(model, tokenizer, ids, 24) and text
    assert stats.prompt_tokens == len(ids) and stats.generated_tokens >= 1 and stats.time_to_first_token > 0


def test_executorch_text_llm_runner_generates_eager_text(exported):
    import etmlx.native  # noqa: F401  (registers the backend with ExecuTorch's runtime)
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    path, model, tokenizer = exported
    runner = TextLLMRunner(str(path), str(path.parent / "tokenizer.json"))
    config = GenerationConfig()
    config.max_new_tokens, config.temperature, config.echo, config.num_bos = 24, 0.0, False, 0
    pieces = []
    runner.generate(PROMPT, config, token_callback=pieces.append)
    assert "".join(pieces) == eager_text(model, tokenizer, tokenizer.encode(PROMPT), 24)


def test_the_same_seed_samples_the_same_text_on_both_runtimes(exported):
    path, _, tokenizer = exported
    texts = {}
    for runtime, seed in (("python", 5), ("executorch", 5), ("python", 6)):
        sampling = generation.Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=seed)
        session = generation.Session(etmlx.load(path, runtime=runtime))
        texts[runtime, seed] = "".join(generation.generate(session, tokenizer, PROMPT, 24, sampling))
    assert texts["python", 5] == texts["executorch", 5] != texts["python", 6]


def test_chat_carries_the_cache_and_replies_as_eager_does(exported):
    from etmlx.llm.chat import Chat

    path, model, tokenizer = exported
    chat = Chat(generation.Session(etmlx.load(path)), tokenizer, max_new_tokens=12)
    first = "".join(chat.reply("hello"))
    held = len(chat.cached)
    second = "".join(chat.reply("how are you"))
    assert chat.fed_from == held > 0  # the second turn fed only what followed the first
    for turn, reply in ((1, first), (2, second)):
        messages = chat.messages[: 2 * turn - 1]
        templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert reply == eager_text(model, tokenizer, tokenizer.encode(templated, add_special_tokens=False), 12)
    chat.reset()
    assert "".join(chat.reply("hello")) == first and chat.fed_from == 0


@pytest.mark.parametrize("args, message", [
    (["export-llm", "{missing}", "-o", "{out}/x.pte"], "no such directory"),
    (["export-llm", "{pte}", "-o", "{out}/x.pte"], "is a file: export-llm takes a Hugging Face checkpoint folder"),
    (["export-llm", "{bert}", "-o", "{out}/x.pte"], "a bert checkpoint saved as BertModel, not a causal language model"),
    (["generate", "{pte}", "--prompt", "x", "--tokenizer", "{missing}"], "no tokenizer at"),
    (["generate", "{pte}", "--prompt", PROMPT * 20], "past the context of 128 tokens"),
    (["generate", "{pte}", "--prompt", "x", "--top-p", "2"], "top_p=2.0: expected in (0, 1]"),
    (["serve", "{missing}"], "no such file"),
])
def test_bad_input_is_one_clear_error(exported, tmp_path, capsys, args, message):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).save_pretrained(
        tmp_path / "bert")
    names = dict(missing=str(tmp_path / "missing"), out=str(tmp_path), bert=str(tmp_path / "bert"), pte=str(exported[0]))
    assert main([a.format(**names) for a in args]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("config, sizes, message", [
    ("ZambaConfig", dict(num_hidden_layers=2, layers_block_type=["mamba", "hybrid"]),
     "zamba: 2 of its 2 layers keep a recurrent state (hybrid, linear_attention)"),
    ("RecurrentGemmaConfig", dict(num_hidden_layers=2, block_types=["recurrent", "attention"]),
     "recurrent_gemma: 1 of its 2 layers keep a recurrent state (linear_attention)"),
])
def test_a_recurrent_family_is_refused_by_name_before_its_weights_load(tmp_path, capsys, config, sizes, message):
    """Families whose recurrent layers etmlx does not export (Zamba's, RecurrentGemma's):
    one line naming the family and what export-llm
    takes, from config.json alone (no weights are written here), and the same from
    ``causal_lm.refuse_recurrent_layers``, which ``export_methods`` calls first."""
    import transformers

    from etmlx.llm import causal_lm

    made = getattr(transformers, config)(vocab_size=64, hidden_size=32, **sizes)
    made.save_pretrained(tmp_path / "checkpoint")
    assert main(["export-llm", str(tmp_path / "checkpoint"), "-o", str(tmp_path / "x.pte")]) == 1
    error = capsys.readouterr().err
    assert message in error and "of a kind etmlx does not export yet" in error
    assert "gated delta nets, Mamba2 or Mamba selective state spaces (bamba, falcon_h1, falcon_mamba," in error
    assert "Traceback" not in error and not (tmp_path / "x.pte").exists()
    with pytest.raises(ExportError, match=re.escape(message)):
        causal_lm.refuse_recurrent_layers(made)


@pytest.mark.parametrize("scheme, runtime", [("int8", "python"), ("nvfp4", "executorch")])
def test_a_quantized_export_generates_the_quantized_models_text(exported, tmp_path, scheme, runtime):
    """``--quantize int8 --group-size 32`` (and nvfp4, a float mode with its own groups and
    a per-tensor scale; the others' kernels are checked in tests/lowering/test_quantized.py):
    the text of the same quantization in eager."""
    from etmlx.quant.weights import quantized_copy

    path, model, tokenizer = exported
    checkpoint = str(tmp_path / "checkpoint")
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    out = tmp_path / f"{scheme}.pte"
    assert main(["export-llm", checkpoint, "-o", str(out), "--max-seq-len", str(CHUNK), "--quantize", scheme,
                 "--group-size", "32"]) == 0
    quantized, names = quantized_copy(model, scheme, 32)
    assert len(names) == 2 * 7 + 2  # every projection, the embedding and the head
    text = "".join(generation.generate(generation.Session(etmlx.load(out, runtime=runtime)), tokenizer, PROMPT, 16))
    assert text == eager_text(quantized, tokenizer, tokenizer.encode(PROMPT), 16) and text


def test_a_hub_id_resolves_to_its_snapshot_in_the_hub_cache(tmp_path, monkeypatch):
    """``export-llm org/name``: the Hub's cache layout (refs/main -> snapshots/<commit>),
    offline, so nothing is downloaded; an id the cache lacks is one clear error."""
    import shutil

    from huggingface_hub import constants

    from etmlx.errors import ExportError
    from etmlx.llm.export import checkpoint_folder

    repo = tmp_path / "hub" / "models--etmlx-test--tiny"
    shutil.copytree(llm.tiny_checkpoint(tmp_path / "checkpoint"), repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert checkpoint_folder("etmlx-test/tiny") == str(repo / "snapshots" / "0123abcd")
    with pytest.raises(ExportError, match="etmlx-test/absent: no such directory, and the Hugging Face Hub gave no copy"):
        checkpoint_folder("etmlx-test/absent")
    with pytest.raises(ExportError, match="a Hub id: org/name"):
        checkpoint_folder("no-such-folder")


@pytest.fixture(scope="module")
def hybrid_exported(tmp_path_factory):
    """A Qwen3.5 checkpoint folder (gated delta nets and attention), exported with 4-bit
    weights; the same quantization of the model in eager."""
    from etmlx.quant.weights import quantized_copy

    checkpoint = tmp_path_factory.mktemp("qwen3_5")
    model = llm.tiny_hybrid("qwen3_5", seed=1, max_cache=CONTEXT)  # a seed whose text holds no EOS
    tokenizer = llm.train_tokenizer(model.config.vocab_size)
    tokenizer.chat_template = llm.CHAT_TEMPLATE
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    out = tmp_path_factory.mktemp("exported") / "qwen3_5.pte"
    assert main(["export-llm", str(checkpoint), "-o", str(out), "--max-seq-len", str(CHUNK), "--quantize", "int4",
                 "--group-size", "32"]) == 0
    quantized, names = quantized_copy(model, "int4", 32)
    assert any("linear_attn" in name for name in names)
    return out, quantized, generation.load_tokenizer(str(out.parent))


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
def test_a_hybrid_checkpoint_generates_its_quantized_text(hybrid_exported, runtime):
    path, model, tokenizer = hybrid_exported
    text = "".join(generation.generate(generation.Session(etmlx.load(path, runtime=runtime)), tokenizer, PROMPT, 16))
    assert text == eager_text(model, tokenizer, tokenizer.encode(PROMPT), 16) and text


def test_executorch_text_llm_runner_drives_a_hybrid_model(hybrid_exported):
    """The runner's prefill in chunks and decode steps carry the recurrent states; a second
    generate (position 0 again) starts from zeroed states."""
    import etmlx.native  # noqa: F401  (registers the backend with ExecuTorch's runtime)
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    path, model, tokenizer = hybrid_exported
    runner = TextLLMRunner(str(path), str(path.parent / "tokenizer.json"))
    config = GenerationConfig()
    config.max_new_tokens, config.temperature, config.echo, config.num_bos = 16, 0.0, False, 0
    expected = eager_text(model, tokenizer, tokenizer.encode(PROMPT), 16)
    for _ in range(2):
        pieces = []
        runner.generate(PROMPT, config, token_callback=pieces.append)
        runner.reset()
        assert "".join(pieces) == expected


def test_chat_with_a_hybrid_model_replies_as_eager_does_and_saves_its_states(hybrid_exported, tmp_path):
    """Each turn as eager; a conversation saved after one turn (KV cache and recurrent
    states) continues in a fresh load with the reply the first load gave."""
    from etmlx.llm.chat import Chat

    path, model, tokenizer = hybrid_exported
    chat = Chat(generation.Session(etmlx.load(path)), tokenizer, max_new_tokens=12)
    replies = ["".join(chat.reply("hello"))]
    chat.save(tmp_path / "conversation.kv")
    replies.append("".join(chat.reply("how are you")))
    for turn, reply in enumerate(replies, 1):
        templated = tokenizer.apply_chat_template(chat.messages[: 2 * turn - 1], add_generation_prompt=True,
                                                  tokenize=False)
        assert reply == eager_text(model, tokenizer, tokenizer.encode(templated, add_special_tokens=False), 12)
    restored = Chat(generation.Session(etmlx.load(path, runtime="executorch")), tokenizer, max_new_tokens=12)
    restored.restore(tmp_path / "conversation.kv")
    held = len(restored.cached)
    assert "".join(restored.reply("how are you")) == replies[1]
    assert restored.fed_from == held > 0  # continued from the restored states, nothing prefilled again
