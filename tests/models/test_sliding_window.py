"""Sliding-window attention over rings of W + max_seq_len cache slots
(``etmlx.llm.sliding_cache``): Mistral (every layer sliding), Gemma 3 (sliding and full
layers mixed) and Gemma 2 (mixed, logits softcapped) give eager's logits at every step
far past the window, on both runtimes, while their sliding layers hold W + R slots."""

import pytest
import runtimes
import torch

import etmlx
from etmlx.llm import causal_lm, generation
from etmlx.llm.chat import Chat
from etmlx.inspection import inspect_program
from etmlx.runtime_shim.errors import IndexRangeError
from examples import llm
from windowing import window_slices

WINDOW, CHUNK, CAPACITY = 16, 8, 128
TOKENS = [(7 * i + 3) % 128 for i in range(3 * WINDOW + 12)]  # past three windows
OTHER = [(5 * i + 1) % 128 for i in range(40)]
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=CAPACITY, sliding_window=WINDOW)


def _model(family: str):
    import transformers

    torch.manual_seed(0)
    if family == "Mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(num_hidden_layers=2, **SIZES))
    elif family == "Gemma3":
        layer_types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
        config = transformers.Gemma3TextConfig(num_hidden_layers=4, head_dim=16, layer_types=layer_types, **SIZES)
        model = transformers.Gemma3ForCausalLM(config)
    else:
        config = transformers.Gemma2Config(num_hidden_layers=2, head_dim=16, **SIZES)  # sliding, full; softcapped
        model = transformers.Gemma2ForCausalLM(config)
    return causal_lm.with_static_cache(model, CAPACITY)


@pytest.fixture(scope="module", params=["Mistral", "Gemma3", "Gemma2"])
def exported(request, tmp_path_factory):
    model = _model(request.param)
    path = tmp_path_factory.mktemp("sliding") / f"{request.param}.pte"
    result = etmlx.export_methods(causal_lm.export_methods(model, max_seq_len=CHUNK), path)
    assert result.report.fully_delegated
    return request.param, model, path


def _eager_last(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


def _close(actual, expected):
    torch.testing.assert_close(torch.as_tensor(actual)[0], expected, rtol=1e-4, atol=1e-5)


def test_sliding_layers_hold_their_window_and_the_rewind(exported):
    family, model, path = exported
    (delegate,) = inspect_program(path)["methods"]["forward"]["delegates"]
    caches = {b["name"]: b for b in delegate["buffers"] if "key_cache" in b["name"]}
    kinds = getattr(model.config, "layer_types", None) or ["sliding_attention"] * model.config.num_hidden_layers
    sliding = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
    for i in range(model.config.num_hidden_layers):
        cache = caches[f"cached.key_cache_{i}"]
        if i in sliding:
            assert cache["shape"][2] == WINDOW + CHUNK and cache["grows_along"] is None
        else:
            assert cache["shape"][2] == CAPACITY and cache["grows_along"] == 2
    assert sliding and (family == "Mistral") == (len(sliding) == model.config.num_hidden_layers)
    if family == "Gemma2":  # softcapped logits, which SDPA cannot compute: its own eager attention, each op on MLX,
        assert "Sdpa" not in delegate["nodes"] and "Tanh" in delegate["nodes"]
        assert window_slices(path) >= 3  # its full layer's keys, values and mask sliced to the window
    else:
        assert "Sdpa" in delegate["nodes"]


def test_logits_equal_eager_at_every_step_past_three_windows(exported):
    """Prefill chunks of 7 that straddle the window's edge, then decode steps."""
    _, model, path = exported
    program = runtimes.load(path)
    with torch.no_grad():
        expected = model(torch.tensor([TOKENS])).logits[0]
    for start in range(0, 3 * 7, 7):
        logits = program.forward(torch.tensor([TOKENS[start:start + 7]]), torch.arange(start, start + 7))
        _close(logits, expected[start + 6])
    for position in range(3 * 7, len(TOKENS)):
        _close(program.forward(torch.tensor([[TOKENS[position]]]), torch.tensor([position])), expected[position])


def test_a_call_may_go_back_up_to_max_seq_len_or_start_over(exported):
    _, model, path = exported
    program = runtimes.load(path)
    for start in range(0, 40, CHUNK):
        program.forward(torch.tensor([OTHER[start:start + CHUNK]]), torch.arange(start, start + CHUNK))
    back = program.forward(torch.tensor([TOKENS[:6]]), torch.arange(34, 40))  # 6 back: within the ring
    _close(back, _eager_last(model, OTHER[:34] + TOKENS[:6]))
    with pytest.raises(IndexRangeError, match="out of range for a dimension of size 9"):
        program.forward(torch.tensor([[1]]), torch.tensor([20]))  # 20 back: overwritten slots
    again = program.forward(torch.tensor([[TOKENS[6]]]), torch.tensor([40]))  # the refused call changed nothing
    _close(again, _eager_last(model, OTHER[:34] + TOKENS[:7]))
    _close(program.forward(torch.tensor([TOKENS[:8]]), torch.arange(8)), _eager_last(model, TOKENS[:8]))


@pytest.mark.parametrize("exported", ["Mistral"], indirect=True)
def test_chat_starts_over_where_the_ring_cannot_go_back(exported):
    """A turn whose held prefix lies further back than the ring reaches is prefilled from
    position 0 instead: the reply is the one a fresh session gives."""
    _, _, path = exported
    tokenizer = llm.train_tokenizer()
    tokenizer.chat_template = llm.CHAT_TEMPLATE
    chat = Chat(generation.Session(etmlx.load(path)), tokenizer, max_new_tokens=6)
    "".join(chat.reply("hello world, the quick brown fox"))
    chat.cached = chat.cached[:3]  # as if only 3 of them matched the next turn's tokens
    reply = "".join(chat.reply("jumps over the lazy dog"))
    assert chat.fed_from == 0
    templated = tokenizer.apply_chat_template(chat.messages[:-1], add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(templated, add_special_tokens=False)
    fresh = generation.Session(etmlx.load(path))
    expected = tokenizer.decode(list(generation.generate_tokens(fresh, ids, 6)), skip_special_tokens=True)
    assert reply == expected


def test_a_sliding_mask_other_than_causal_is_refused_with_the_reason():
    import transformers

    config = transformers.Gemma3TextConfig(num_hidden_layers=2, head_dim=16, use_bidirectional_attention=True, **SIZES)
    model = causal_lm.with_static_cache(transformers.Gemma3ForCausalLM(config), CAPACITY)
    with pytest.raises(etmlx.ExportError, match="bidirectional sliding attention layers mask otherwise than causal"):
        causal_lm.export_methods(model, max_seq_len=CHUNK)
