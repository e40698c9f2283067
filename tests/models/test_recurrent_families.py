"""Hybrid families whose layers keep a recurrent state (``etmlx.llm.recurrent_state``),
one of each kind: LFM2's short convolutions, Qwen3-Next's gated delta nets (and experts),
Mamba2's state spaces alone, Falcon-H1's beside attention in one layer, Jamba's Mamba (v1)
selective scans beside attention and experts (all fourteen families, float and int4:
tests/sweep/test_hybrid_families.py, which CI runs too).
Their states live in the delegate beside the KV cache, carried across a prompt prefilled
in chunks and the decode steps, and zeroed by a call at position 0."""

import numpy as np
import pytest
import torch
from hybrids import PROMPT, check_generation, exported

import etmlx
from etmlx.llm import generation
from etmlx.llm.recurrent_state import SCANNED

KINDS = ["lfm2", "qwen3_next", "mamba2", "falcon_h1", "jamba"]


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


def test_a_state_only_a_scan_reads_is_zeroed_by_the_scan_not_before_it(family):
    """At position 0 every state starts from zeros: a convolution window (and a gated
    delta or selective-scan state) by a ``Where`` on its buffer before the layer reads it;
    a Mamba2 state by its scan's own selects after the terms that read it (a matmul reads
    it besides the decay, so a select on the buffer would be one more pass over it)."""
    from etmlx.runtime_shim.pte_file import read_pte
    from etmlx.serializer import BACKEND_ID, deserialize, node_type

    model, result = family
    pte = read_pte(str(result.path))
    (plan,) = [plan for plan in pte.program.plans if plan.name == "forward"]
    (delegate,) = [d for d in plan.delegates if d.id == BACKEND_ID]
    graph = deserialize(pte.delegate_data(delegate))
    selected = {slot for node in graph.nodes if node_type(node) == "Where" for slot in (node.op.a.idx, node.op.b.idx)}
    read_by_a_select = {}  # kind of state -> whether each layer's is read by a Where
    for buffer in graph.buffers:
        if "_state_" in buffer.name:  # cached.conv_state_3_0: layer 3's first window
            kind = buffer.name.split(".")[-1].rsplit("_", 2)[0]
            read_by_a_select.setdefault(kind, set()).add(buffer.initial.slot in selected)
    scanned = model.config.get_text_config().model_type in SCANNED
    assert read_by_a_select.pop("conv_state") == {True}
    assert read_by_a_select == ({} if model.config.model_type == "lfm2" else {"recurrent_state": {not scanned}})


def test_the_traced_recurrences_compute_what_transformers_chunked_ones_do():
    """What etmlx traces in place of transformers' chunked recurrences, from a previous
    state, equal to them: the gated delta rule (its state in MLX's layout, transposed from
    transformers') and Mamba2's scan over a call that is not a whole chunk."""
    from transformers.models.mamba2 import modeling_mamba2
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from etmlx.llm.recurrent_kernels import gated_delta_rule, state_space_scan

    torch.manual_seed(0)
    q, k = torch.randn(1, 7, 2, 16), torch.randn(1, 7, 2, 16)
    v, g, beta = torch.randn(1, 7, 4, 8), -torch.rand(1, 7, 4), torch.rand(1, 7, 4)
    state = torch.randn(1, 4, 16, 8)  # transformers' (B, H, Dk, Dv)
    options = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    expected = modeling_qwen3_5.torch_chunk_gated_delta_rule(q, k, v, g, beta, **options)
    actual = gated_delta_rule(q, k, v, g, beta, **{**options, "initial_state": state.transpose(-1, -2)})
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(actual[1].transpose(-1, -2), expected[1], rtol=1e-4, atol=1e-5)

    x, dt = torch.randn(1, 5, 4, 8), torch.randn(1, 5, 4)
    b, c, a = torch.randn(1, 5, 2, 6), torch.randn(1, 5, 2, 6), -torch.rand(4) * 4
    options = dict(D=torch.randn(4), dt_bias=torch.randn(4), initial_states=torch.randn(1, 4, 8, 6), dt_softplus=True,
                   return_final_states=True)
    expected = modeling_mamba2.mamba2_chunk_scan(x, dt, a, b, c, 256, **options)
    actual = state_space_scan(x, dt, a, b, c, 256, **options)
    for got, wanted in zip(actual, expected):
        torch.testing.assert_close(got, wanted, rtol=1e-4, atol=1e-5)
