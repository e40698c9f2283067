"""Attention over the filled part of the KV cache (``etmlx.causal_lm``) gives the logits
of attention over the whole cache (transformers' own export wrapper), at every position
from the first cache slot to the last, on both runtimes."""

import pytest
import runtimes
import torch

import etmlx
from etmlx.causal_lm import WINDOW_STEP, window
from etmlx.inspection import inspect_program
from examples import llm
from windowing import reads_a_window, sdpa_operand_slices

CAPACITY = 2 * WINDOW_STEP  # two windows: 256 and 512 slots
PROMPT = [5, 17, 42, 8, 99, 3]
EXACT = dict(rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    model = llm.tiny_llama(max_cache=CAPACITY)
    folder = tmp_path_factory.mktemp("windowed")
    paths = {"windowed": folder / "windowed.pte", "whole": folder / "whole.pte"}
    etmlx.export_methods(llm.export_methods(model), paths["windowed"])
    etmlx.export_methods(llm.export_whole_cache_methods(model), paths["whole"])
    return paths


def test_keys_values_and_mask_are_sliced_to_the_window_before_attention(programs):
    """Every Sdpa of the windowed methods reads keys, values and mask through a Slice
    whose length is a run-time size (the window's); the whole-cache form has none such."""
    assert len(sdpa_operand_slices(programs["windowed"])) == 3 * 2
    assert reads_a_window(programs["windowed"], "decode") and reads_a_window(programs["windowed"], "prefill")
    whole = sdpa_operand_slices(programs["whole"])
    assert len(whole) == 3 * 2 and not any(s is not None and s.op.stop.isSlot for s in whole)
    for path in programs.values():
        assert inspect_program(path)["methods"]["decode"]["kernels"] == []


def test_logits_equal_whole_cache_attention_up_to_the_last_slot(programs):
    windowed, whole = runtimes.load(programs["windowed"]), runtimes.load(programs["whole"])
    ids, positions = torch.tensor([PROMPT]), torch.arange(len(PROMPT))
    torch.testing.assert_close(
        windowed.prefill(ids, positions, window(len(PROMPT), CAPACITY)), whole.prefill(ids, positions), **EXACT
    )
    for position in (6, 7, WINDOW_STEP - 1, WINDOW_STEP, 300, CAPACITY - 1):
        token, at = torch.tensor([[position % 128]]), torch.tensor([position])
        torch.testing.assert_close(
            windowed.decode(token, at, window(position + 1, CAPACITY)), whole.decode(token, at), **EXACT
        )


@pytest.mark.parametrize("slots", [1, 7, WINDOW_STEP, CAPACITY])
def test_first_slot_with_any_window_that_covers_it(programs, slots):
    """Decoding into slot 0 of an empty cache: every window length gives the same logits."""
    token, at = torch.tensor([[9]]), torch.tensor([0])
    expected = runtimes.load(programs["whole"]).decode(token, at)
    got = runtimes.load(programs["windowed"]).decode(token, at, torch.zeros(slots, dtype=torch.bool))
    torch.testing.assert_close(got, expected, **EXACT)


def test_a_prefill_across_a_window_boundary(programs):
    """A prompt written at slots 250..259 (past the first window), then a decode step."""
    windowed, whole = runtimes.load(programs["windowed"]), runtimes.load(programs["whole"])
    ids, positions = torch.tensor([list(range(10, 20))]), torch.arange(250, 260)
    torch.testing.assert_close(windowed.prefill(ids, positions, window(260, CAPACITY)), whole.prefill(ids, positions),
                               **EXACT)
    token, at = torch.tensor([[3]]), torch.tensor([260])
    torch.testing.assert_close(windowed.decode(token, at, window(261, CAPACITY)), whole.decode(token, at), **EXACT)


def test_a_window_too_short_raises_and_changes_nothing(programs):
    from etmlx.runtime_shim.errors import IndexRangeError

    program, reference = runtimes.load(programs["windowed"]), runtimes.load(programs["windowed"])
    for p in (program, reference):
        p.prefill(torch.tensor([PROMPT]), torch.arange(len(PROMPT)), window(len(PROMPT), CAPACITY))
    message = r"'cache_position' holds index 300, out of range for a dimension of size 256"
    with pytest.raises(IndexRangeError, match=message):
        program.decode(torch.tensor([[7]]), torch.tensor([300]), window(WINDOW_STEP, CAPACITY))
    step = (torch.tensor([[7]]), torch.tensor([6]), window(7, CAPACITY))
    torch.testing.assert_close(program.decode(*step), reference.decode(*step), rtol=0, atol=0)


def test_a_window_longer_than_the_cache_is_refused(programs):
    from etmlx.runtime_shim.errors import InputError

    program = runtimes.load(programs["windowed"])
    with pytest.raises(InputError, match=r"input 2 has shape \(513,\), expected \(<=512,\)"):
        program.decode(torch.tensor([[7]]), torch.tensor([6]), torch.zeros(CAPACITY + 1, dtype=torch.bool))


@pytest.mark.parametrize(
    "filled, capacity, length",
    [(1, 512, 256), (256, 512, 256), (257, 512, 512), (512, 600, 512), (513, 600, 600), (600, 600, 600)],
)
def test_window_rounds_up_to_a_step_within_the_cache(filled, capacity, length):
    assert window(filled, capacity).shape == (length,)


@pytest.mark.parametrize("filled", [0, 513])
def test_window_outside_the_cache_is_a_value_error(filled):
    with pytest.raises(ValueError, match=f"filled={filled}: expected 1 to 512"):
        window(filled, 512)


def test_a_model_that_bypasses_the_attention_interface_is_named(monkeypatch):
    """A model computing attention its own way never reads the window: refused, not
    exported to attend over the whole cache behind the caller's back."""
    from transformers.models.llama import modeling_llama

    from etmlx import ExportError, causal_lm

    interface = modeling_llama.ALL_ATTENTION_FUNCTIONS
    monkeypatch.setattr(interface, "get_interface", lambda *_: modeling_llama.eager_attention_forward)
    with pytest.raises(ExportError, match="LlamaForCausalLM does not call attention through transformers'"):
        causal_lm.export_methods(llm.tiny_llama(), max_prompt=8)

