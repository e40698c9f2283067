"""The etmlx:: custom ops behave as PyTorch custom ops must: opcheck, compile, export."""

import pytest
import torch
import torch.nn.functional as F

import etmlx.lowering.custom_ops  # noqa: F401


SDPA_SAMPLES = [
    (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 5), None, True, 0.35),
    (torch.randn(2, 4, 6, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8), torch.rand(6, 7) > 0.3, False, 0.2),
    (torch.randn(3, 6, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 8), None, False, 0.5),
]


@pytest.mark.parametrize("args", SDPA_SAMPLES)
def test_sdpa_opcheck(args):
    torch.library.opcheck(torch.ops.etmlx.sdpa.default, args)


def test_sdpa_matches_aten_with_gqa():
    q, k, v, mask, causal, scale = SDPA_SAMPLES[1]
    expected = F.scaled_dot_product_attention(q, k, v, mask, scale=scale, enable_gqa=True)
    torch.testing.assert_close(torch.ops.etmlx.sdpa(q, k, v, mask, causal, scale), expected)


def test_roll_opcheck():
    torch.library.opcheck(torch.ops.etmlx.roll.default, (torch.randn(3, 5), [1, -2], [0, 1]))


class CallsCustomOps(torch.nn.Module):
    def forward(self, q, k, v):
        y = torch.ops.etmlx.sdpa(q, k, v, None, True, 0.25)
        return torch.ops.etmlx.roll(y, [1], [2])


def test_traces_with_compile_fullgraph():
    args = (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8))
    compiled = torch.compile(CallsCustomOps(), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(*args), CallsCustomOps()(*args))


def test_traces_with_export():
    args = (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8))
    program = torch.export.export(CallsCustomOps(), args)
    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert targets == {torch.ops.etmlx.sdpa.default, torch.ops.etmlx.roll.default}
    torch.testing.assert_close(program.module()(*args), CallsCustomOps()(*args))
