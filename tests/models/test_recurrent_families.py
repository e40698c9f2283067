"""Hybrid families whose layers keep a recurrent state (``etmlx.llm.recurrent_state``),
one of each kind: LFM2's short convolutions, Qwen3-Next's gated delta nets (and experts),
Mamba2's state spaces alone, Falcon-H1's beside attention in one layer, Nemotron-H's
beside attention and MLP-only layers (all ten families: tests/sweep/test_hybrid_families.py).
Their states live in the delegate beside the KV cache, carried across a prompt prefilled
in chunks and the decode steps, and zeroed by a call at position 0."""

import numpy as np
import pytest
import torch
from hybrids import PROMPT, check_generation, exported

import etmlx
from etmlx.llm import generation

KINDS = ["lfm2", "qwen3_next", "mamba2", "falcon_h1", "nemotron_h"]


@pytest.fixture(scope="module", params=KINDS)
def family(request, tmp_path_factory):
    return exported(request.param, tmp_path_factory.mktemp(request.param))


def test_a_hybrid_family_generates_eager_tokens_from_states_in_the_delegate(family):
    check_generation(*family)


def test_a_recurrent_state_cannot_rewind_so_a_session_prefills_again(family):
    """A KV cache can go back to a shorter prefix; a recurrent state has taken in every
    token fed: ``Session.rewind`` resumes at 0 rather than from a wrong state."""
    model, result = family
    session = generation.Session(etmlx.load(result.path))
    assert session.limits["use_recurrent_state"] is True
    session.feed(PROMPT)
    assert session.rewind(session.position) == len(PROMPT)  # going nowhere is fine
    assert session.rewind(4) == 0 and session.position == 0
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT[:6]])).logits[0, -1].numpy()
    np.testing.assert_allclose(session.feed(PROMPT[:6]), expected, rtol=1e-4, atol=1e-4)
