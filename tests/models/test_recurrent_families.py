"""Hybrid families whose layers keep a recurrent state (``etmlx.llm.recurrent_state``):
LFM2's short convolutions, the gated delta nets of Qwen3.5 and Qwen3-Next, with and
without experts. Their states live in the delegate beside the KV cache, carried across a
prompt prefilled in chunks and the decode steps, and zeroed by a call at position 0."""

import numpy as np
import pytest
import runtimes
import torch

import etmlx
from etmlx.inspection import inspect_program
from etmlx.llm import generation
from examples import llm

CAPACITY, CHUNK = 128, 4
PROMPT = [5, 17, 42, 8, 99, 3, 7, 9, 11]  # more tokens than a chunk


@pytest.fixture(scope="module", params=sorted(llm.HYBRIDS))
def exported(request, tmp_path_factory):
    model = llm.tiny_hybrid(request.param, max_cache=CAPACITY)
    path = tmp_path_factory.mktemp(request.param) / "lm.pte"
    return request.param, model, etmlx.export_methods(llm.export_methods(model, CHUNK), path)


def test_a_hybrid_family_generates_eager_tokens_from_states_in_the_delegate(exported):
    family, model, result = exported
    assert result.report.fully_delegated
    delegates = inspect_program(result.path)["methods"]["forward"]["delegates"]
    buffers = {b["name"] for d in delegates for b in d["buffers"]}
    nodes = [node for d in delegates for node in d["nodes"]]
    recurrent = [i for i, kind in enumerate(model.config.layer_types) if kind != "full_attention"]
    assert {f"cached.conv_state_{i}_0" for i in recurrent} <= buffers
    assert not any(f"cached.key_cache_{i}" in buffers for i in recurrent)  # no KV cache where none is read
    delta_rule = family.startswith("qwen3")
    assert ({f"cached.recurrent_state_{i}_0" for i in recurrent} <= buffers) == delta_rule
    assert nodes.count("GatedDelta") == (2 * len(recurrent) if delta_rule else 0)
    program = runtimes.load(result.path)  # both runtimes, their outputs compared at every call
    expected = llm.eager_greedy(model, PROMPT, 12)
    assert llm.greedy(program, PROMPT, 12) == expected
    assert llm.greedy(program, PROMPT, 12) == expected  # position 0 starts a new sequence: states zeroed


def test_a_recurrent_state_cannot_rewind_so_a_session_prefills_again(exported):
    """A KV cache can go back to a shorter prefix; a recurrent state has taken in every
    token fed: ``Session.rewind`` resumes at 0 rather than from a wrong state."""
    _, model, result = exported
    session = generation.Session(etmlx.load(result.path))
    assert session.limits["use_recurrent_state"] is True
    session.feed(PROMPT)
    assert session.rewind(session.position) == len(PROMPT)  # going nowhere is fine
    assert session.rewind(4) == 0 and session.position == 0
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT[:6]])).logits[0, -1].numpy()
    np.testing.assert_allclose(session.feed(PROMPT[:6]), expected, rtol=1e-4, atol=1e-4)
