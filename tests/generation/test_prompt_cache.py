"""Saved prompts (``etmlx.llm.prompt_cache``): a program's KV cache after a prefill, saved to
a file and restored into a fresh load, on either runtime, continues exactly as one
uninterrupted run; ``etmlx chat --prompt-cache`` continues a conversation from it; a
damaged or foreign file is one PromptCacheError naming the problem."""

import io
import json
import struct
import sys
import zlib

import numpy as np
import pytest

import etmlx
from etmlx.llm import generation, prompt_cache
from etmlx.llm.chat import Chat
from etmlx.cli import main
from examples import llm

CONTEXT, CHUNK = 128, 8
PROMPT = list(range(3, 23))  # 20 tokens: prefilled in three chunks
RUNTIME_PAIRS = [(a, b) for a in etmlx.RUNTIMES for b in etmlx.RUNTIMES]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    checkpoint = llm.tiny_checkpoint(tmp_path_factory.mktemp("checkpoint"), max_cache=CONTEXT)
    out = tmp_path_factory.mktemp("exported")
    assert main(["export-llm", checkpoint, "-o", str(out / "model.pte"), "--max-seq-len", str(CHUNK)]) == 0
    return out / "model.pte", generation.load_tokenizer(str(out))


def _continue(session, tokens) -> list:
    """The logits of feeding ``tokens`` one at a time."""
    return [session.feed([token]) for token in tokens]


@pytest.mark.parametrize("saved_on, restored_on", RUNTIME_PAIRS)
def test_a_restored_prompt_continues_as_one_uninterrupted_run(exported, tmp_path, saved_on, restored_on):
    path, _ = exported
    saved = generation.Session(etmlx.load(path, runtime=saved_on))
    saved.feed(PROMPT)
    prompt_cache.save(saved.program, tmp_path / "prompt.kv", PROMPT, {"note": "a test"})
    uninterrupted = _continue(saved, [5, 9, 11])
    restored = generation.Session(etmlx.load(path, runtime=restored_on))
    tokens, extra = prompt_cache.restore(restored.program, tmp_path / "prompt.kv")
    assert tokens == PROMPT and extra == {"note": "a test"}
    restored.position = len(tokens)
    for a, b in zip(_continue(restored, [5, 9, 11]), uninterrupted):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_the_file_holds_the_filled_windows_only(exported, tmp_path):
    """20 tokens of a 128-token context: one window of 256 slots is the whole cache, so
    the file is about the cache's size; the growing cache of 2 layers holds 128 slots."""
    path, _ = exported
    session = generation.Session(etmlx.load(path))
    session.feed(PROMPT)
    prompt_cache.save(session.program, tmp_path / "prompt.kv", PROMPT)
    held = {name: array.shape for name, (_, array) in session.program.read_state().items() if "key_cache" in name}
    assert set(held.values()) == {(1, 2, CONTEXT, 16)}
    assert (tmp_path / "prompt.kv").stat().st_size < 4 * 2 * CONTEXT * 16 * 4 + 4096


def test_chat_continues_a_saved_conversation_prefilling_only_the_new_turn(exported, tmp_path):
    path, tokenizer = exported
    first = Chat(generation.Session(etmlx.load(path)), tokenizer, max_new_tokens=8)
    "".join(first.reply("hello"))
    first.save(tmp_path / "chat.kv")
    expected = "".join(first.reply("how are you"))
    resumed = Chat(generation.Session(etmlx.load(path, runtime="executorch")), tokenizer, max_new_tokens=8)
    resumed.restore(tmp_path / "chat.kv")
    held = len(resumed.cached)
    assert "".join(resumed.reply("how are you")) == expected
    assert resumed.fed_from == held > 0


def test_etmlx_chat_prompt_cache_continues_across_runs(exported, tmp_path, monkeypatch, capsys):
    path, tokenizer = exported
    reference = Chat(generation.Session(etmlx.load(path)), tokenizer, max_new_tokens=8)
    replies = ["".join(reference.reply(text)) for text in ("hello", "how are you")]
    file = str(tmp_path / "chat.kv")
    for turn, text in enumerate(("hello", "how are you")):
        monkeypatch.setattr(sys, "stdin", io.StringIO(text + "\n/quit\nnot read\n"))  # /quit ends the chat
        assert main(["chat", str(path), "--prompt-cache", file, "--max-new-tokens", "8"]) == 0
        out, err = capsys.readouterr()
        assert out.strip() == replies[turn].strip()
        assert ("(continuing" in err) == (turn == 1)


def _reseal(data: bytes, header=None, body=None) -> bytes:
    """The file with its header (a dict) or data replaced and the checksum made valid."""
    _, version, _, length = struct.unpack_from("<8sIIQ", data)
    old_header, old_body = data[24:24 + length], data[24 + length:]
    new_header = json.dumps(header).encode() if header is not None else old_header
    rest = struct.pack("<Q", len(new_header)) + new_header + (old_body if body is None else body)
    return struct.pack("<8sII", b"ETMLXKV\0", version, zlib.crc32(rest)) + rest


def _edited(field, value):
    def edit(data):
        header = json.loads(data[24:24 + struct.unpack_from("<Q", data, 16)[0]])
        entry = next(b for b in header["buffers"] if "key_cache" in b["name"])
        entry[field] = value
        return _reseal(data, header)
    return edit


DAMAGE = {
    "truncated": (lambda d: d[: len(d) // 2], "damaged"),
    "no header": (lambda d: d[:10], "not a saved prompt"),
    "bad magic": (lambda d: b"PNG" + d[3:], "not a saved prompt"),
    "a flipped byte": (lambda d: d[:-5] + bytes([d[-5] ^ 1]) + d[-4:], "damaged"),
    "a newer format": (lambda d: d[:8] + struct.pack("<I", 9) + d[12:], "format 9; this etmlx reads 1"),
    "a shape its bytes do not fill": (_edited("shape", [1, 2, 4096, 16]), "has 16384 bytes; its shape needs"),
    "a shape past the capacity": (_edited("shape", [1, 1, 256, 16]), "float32\\[1, 1, 256, 16\\]; this program's is"),
    "another dtype": (_edited("dtype", "int32"), "is int32"),
    "bytes outside the file": (_edited("offset", 2**40), "lies outside the file"),
    "an unknown dtype": (_edited("dtype", "complex64"), "a known dtype"),
    "a dtype that is no name": (_edited("dtype", []), "a known dtype"),  # found by the fuzzer
    "a buffer this program lacks": (_edited("name", "cached.key_cache_9"), "missing"),
}


@pytest.mark.parametrize("runtime", etmlx.RUNTIMES)
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_file_is_refused_by_name_changing_nothing(exported, tmp_path, runtime, damage):
    path, _ = exported
    session = generation.Session(etmlx.load(path))
    session.feed(PROMPT)
    prompt_cache.save(session.program, tmp_path / "prompt.kv", PROMPT)
    change, message = DAMAGE[damage]
    (tmp_path / "damaged.kv").write_bytes(change((tmp_path / "prompt.kv").read_bytes()))
    program = etmlx.load(path, runtime=runtime)
    before = program.read_state()
    with pytest.raises(prompt_cache.PromptCacheError, match=message):
        prompt_cache.restore(program, tmp_path / "damaged.kv")
    after = program.read_state()
    assert all(np.array_equal(after[name][1], array) for name, (_, array) in before.items())


def test_a_file_from_another_export_is_refused_by_name(exported, tmp_path):
    path, _ = exported
    other = tmp_path / "other.pte"
    etmlx.export_methods(llm.export_methods(llm.tiny_llama(max_cache=CONTEXT), CHUNK), other)
    session = generation.Session(etmlx.load(other))
    session.feed(PROMPT)
    prompt_cache.save(session.program, tmp_path / "other.kv", PROMPT)
    for runtime in etmlx.RUNTIMES:
        with pytest.raises(prompt_cache.PromptCacheError, match="saved from another program"):
            prompt_cache.restore(etmlx.load(path, runtime=runtime), tmp_path / "other.kv")
    assert main(["chat", str(path), "--prompt-cache", str(tmp_path / "other.kv")]) == 1
