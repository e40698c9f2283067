"""Attention over the filled part of the KV cache (``etmlx.llm.causal_lm``) gives the logits
of attention over the whole cache (transformers' own export wrapper), at every position
from the first cache slot to the last, in every window bucket, on both runtimes."""

import pytest
import runtimes
from lowering_harness import WINDOW_READ, tensor_kernels
import torch

import etmlx
from etmlx.inspection import constant_methods, inspect_program
from examples import llm
from windowing import reads_a_window, sdpa_operand_slices

STEP = 16  # window buckets of 16 slots: 64, 48, 32, 16
CAPACITY = 4 * STEP
MAX_SEQ_LEN = 8
PROMPT = [5, 17, 42, 8, 99, 3]
EXACT = dict(rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    model = llm.tiny_llama(max_cache=CAPACITY)
    folder = tmp_path_factory.mktemp("windowed")
    paths = {"windowed": folder / "windowed.pte", "whole": folder / "whole.pte"}
    etmlx.export_methods(llm.export_methods(model, MAX_SEQ_LEN, window_step=STEP), paths["windowed"])
    etmlx.export_methods(llm.export_whole_cache_methods(model, MAX_SEQ_LEN), paths["whole"])
    return paths


def test_keys_values_and_mask_are_sliced_to_the_window_before_attention(programs):
    """Every Sdpa reads keys, values and mask through a Slice whose length is a run-time
    size, read from the call's last cache position on the host; the whole-cache form has
    none such. Nothing else runs outside MLX."""
    assert len(sdpa_operand_slices(programs["windowed"])) == 3 * 2
    assert reads_a_window(programs["windowed"])
    whole = sdpa_operand_slices(programs["whole"])
    assert len(whole) == 3 * 2 and not any(s is not None and s.op.stop.isSlot for s in whole)
    forward = inspect_program(programs["windowed"])["methods"]["forward"]
    assert len(forward["delegates"]) == 1
    assert tensor_kernels(forward["kernels"]) == WINDOW_READ  # then the bucket's arithmetic: scalar ops
    assert {k.split("::")[0] for k in forward["kernels"]} == {"aten", "executorch_prim"}


def test_the_runner_metadata_is_written(programs):
    assert constant_methods(programs["windowed"]) == {
        "get_max_seq_len": [MAX_SEQ_LEN], "get_max_context_len": [CAPACITY], "get_vocab_size": [128],
        "use_kv_cache": [True], "enable_dynamic_shape": [True], "get_bos_id": [1], "get_eos_ids": [2],
    }


def _last(logits):
    return logits[:, -1, :]


def test_logits_equal_whole_cache_attention_up_to_the_last_slot(programs):
    windowed, whole = runtimes.load(programs["windowed"]), runtimes.load(programs["whole"])
    ids, positions = torch.tensor([PROMPT]), torch.arange(len(PROMPT))
    torch.testing.assert_close(windowed.forward(ids, positions), _last(whole.forward(ids, positions)), **EXACT)
    for position in (6, 7, STEP - 1, STEP, STEP + 1, 2 * STEP + 5, CAPACITY - 1):
        token, at = torch.tensor([[position % 128]]), torch.tensor([position])
        torch.testing.assert_close(windowed.forward(token, at), _last(whole.forward(token, at)), **EXACT)


@pytest.mark.parametrize("start", [STEP - 4, 2 * STEP - 1, CAPACITY - MAX_SEQ_LEN])
def test_a_prefill_chunk_across_a_window_boundary(programs, start):
    """A chunk written at slots start..start+7 (reaching into the next bucket), then a decode step."""
    windowed, whole = runtimes.load(programs["windowed"]), runtimes.load(programs["whole"])
    ids, positions = torch.tensor([list(range(10, 10 + MAX_SEQ_LEN))]), torch.arange(start, start + MAX_SEQ_LEN)
    torch.testing.assert_close(windowed.forward(ids, positions), _last(whole.forward(ids, positions)), **EXACT)
    if start + MAX_SEQ_LEN < CAPACITY:
        token, at = torch.tensor([[3]]), torch.tensor([start + MAX_SEQ_LEN])
        torch.testing.assert_close(windowed.forward(token, at), _last(whole.forward(token, at)), **EXACT)


def test_a_position_past_the_cache_raises_and_changes_nothing(programs):
    from etmlx.runtime_shim.errors import IndexRangeError

    program, reference = runtimes.load(programs["windowed"]), runtimes.load(programs["windowed"])
    for p in (program, reference):
        p.forward(torch.tensor([PROMPT]), torch.arange(len(PROMPT)))
    message = rf"'cache_position' holds index {CAPACITY}, out of range for a dimension of size {CAPACITY}"
    with pytest.raises(IndexRangeError, match=message):
        program.forward(torch.tensor([[7]]), torch.tensor([CAPACITY]))
    with pytest.raises(IndexRangeError, match="'cache_position' holds index -1"):
        program.forward(torch.tensor([[7]]), torch.tensor([-1]))
    step = (torch.tensor([[7]]), torch.tensor([6]))
    torch.testing.assert_close(program.forward(*step), reference.forward(*step), rtol=0, atol=0)


def test_a_chunk_longer_than_max_seq_len_is_refused(programs):
    from etmlx.runtime_shim.errors import InputError

    program = runtimes.load(programs["windowed"])
    with pytest.raises(InputError, match=rf"input 0 has shape \(1, {MAX_SEQ_LEN + 1}\), expected \(<=1, <={MAX_SEQ_LEN}\)"):
        program.forward(torch.zeros(1, MAX_SEQ_LEN + 1, dtype=torch.long), torch.arange(MAX_SEQ_LEN + 1))


def test_greedy_tokens_equal_eager_over_every_bucket_with_a_chunked_prompt(programs):
    """A prompt of 13 tokens (two chunks of at most 8), then decode to the cache's end."""
    model, prompt = llm.tiny_llama(max_cache=CAPACITY), list(range(20, 33))
    expected = llm.eager_greedy(model, prompt, CAPACITY - len(prompt))
    assert llm.greedy(runtimes.load(programs["windowed"]), prompt, CAPACITY - len(prompt)) == expected


def test_a_model_that_bypasses_the_attention_interface_attends_over_the_whole_cache(monkeypatch, caplog):
    """A model computing attention its own way never reads the window (its first trace
    would be wrong: its attention gets a mask made for the window's): traced again with
    its own attention and mask over the whole cache, named in a warning; with a quantized
    cache, which only the window's attention reads, refused."""
    from transformers.models.llama import modeling_llama

    from etmlx import ExportError
    from etmlx.llm import causal_lm
    from etmlx.llm.windowed_cache import attends_through_window

    interface = modeling_llama.ALL_ATTENTION_FUNCTIONS
    monkeypatch.setattr(interface, "get_interface", lambda *_: modeling_llama.eager_attention_forward)
    with caplog.at_level("WARNING", logger="etmlx"):
        methods = causal_lm.export_methods(llm.tiny_llama(), max_seq_len=8)
    assert not attends_through_window(methods["forward"])
    assert "LlamaForCausalLM does not call attention through transformers' AttentionInterface: each step attends " \
           "over the whole cache of 64 slots" in caplog.text
    with pytest.raises(ExportError, match="cannot attend over a quantized cache; export it without kv_bits"):
        causal_lm.export_methods(llm.tiny_llama(hidden=128), max_seq_len=8, kv_bits=8, kv_group_size=32)


@pytest.mark.parametrize("options, message", [
    (dict(max_seq_len=0), "max_seq_len=0: expected 1 to the cache's 64 tokens"),
    (dict(max_seq_len=65), "max_seq_len=65"),
    (dict(window_step=0), "window_step=0"),
])
def test_export_options_are_checked(options, message):
    from etmlx import ExportError

    from etmlx.llm import causal_lm

    with pytest.raises(ExportError, match=message):
        causal_lm.export_methods(llm.tiny_llama(), **options)


def test_a_family_that_does_not_export_says_why_in_one_line(monkeypatch):
    """torch.export's pages of text come down to the exception the model's code raised
    while traced (eagerly it runs)."""
    from transformers.models.llama import modeling_llama

    from etmlx import ExportError

    from etmlx.llm import causal_lm

    eager = modeling_llama.LlamaMLP.forward

    def refuses(self, x):
        if torch.compiler.is_compiling():
            raise ValueError("intermediate size does not divide")
        return eager(self, x)

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", refuses)
    with pytest.raises(ExportError, match="LlamaForCausalLM does not export as a causal LM") as raised:
        causal_lm.export_methods(llm.tiny_llama(), MAX_SEQ_LEN)
    assert "ValueError: intermediate size does not divide" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_trace_that_holds_for_some_lengths_only_is_refused(monkeypatch):
    """torch.export keeps the conditions on the call's length it could not prove beside
    the program (the length is traced as DYNAMIC); each is checked at every length the
    export allows, so a model that computes otherwise for some lengths is refused, not
    exported for the lengths its trace happened to take."""
    from transformers.models.llama import modeling_llama

    from etmlx import ExportError
    from etmlx.llm import causal_lm

    eager = modeling_llama.LlamaMLP.forward

    def by_parity(self, x):
        return eager(self, x) * (2 if x.shape[1] % 2 == 0 else 1)

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", by_parity)
    with pytest.raises(ExportError, match="holds only under the guard .*, which a call of 1 tokens breaks"):
        causal_lm.export_methods(llm.tiny_llama(), MAX_SEQ_LEN)
