"""``stream_text``: what a stream shows joins to the whole text, a multi-byte character
never split between pieces, a stop string never shown."""

import pytest

from etmlx.llm.generation import Stats, stream_text

TEXT = "a é, then € and 😀 end"


@pytest.fixture(scope="module")
def byte_tokenizer():
    """A byte-level BPE with no merges past single bytes: é is two tokens, € three, 😀 four."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet), initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_a_multi_byte_character_is_never_split(byte_tokenizer):
    ids = byte_tokenizer.encode(TEXT)
    assert len(ids) == len(TEXT.encode())  # one token per byte
    pieces = list(stream_text(byte_tokenizer, iter(ids)))
    assert "".join(pieces) == TEXT and not any("\ufffd" in piece for piece in pieces)
    assert len(pieces) > 5  # shown as it comes, not at the end


def test_a_stop_string_ends_the_text_unshown(byte_tokenizer):
    stats = Stats()
    pieces = list(stream_text(byte_tokenizer, iter(byte_tokenizer.encode(TEXT)), stop=("€ a",), stats=stats))
    assert "".join(pieces) == "a é, then " and stats.stop_reason == "stop string"


def test_an_eos_token_ends_the_text_and_is_the_stop_reason(byte_tokenizer):
    """The generator of tokens is left waiting at the EOS it yielded, so ``stream_text``
    says why the text ended (before: the stats said max_new_tokens)."""
    stats, ids = Stats(), byte_tokenizer.encode(TEXT)
    eos = next(token for token in range(len(byte_tokenizer)) if token not in ids)
    stats.stop_reason = "max_new_tokens"
    pieces = list(stream_text(byte_tokenizer, iter(ids[:2] + [eos] + ids[2:]), stats=stats, eos=(eos,)))
    assert "".join(pieces) == TEXT[:2] and stats.stop_reason == "eos"
