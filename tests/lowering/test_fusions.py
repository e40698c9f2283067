"""The fusions of ``lowering/fusions``: each fuses what it names, with parity, and leaves
look-alikes alone. (The fused calls, attention and roll, are tested with their rules
in test_attention.py and test_custom_ops.py.)"""

import pytest
import torch
from ruletest import delegated

from etmlx.lowering.fusions import LOWERING_FUSIONS


def test_every_lowering_fusion_is_listed_here():
    assert [fusion.NAME for fusion in LOWERING_FUSIONS] == ["RMS norm -> mx.fast.rms_norm"]


class LlamaStyleRmsNorm(torch.nn.Module):
    """As transformers writes it: to float32, x * rsqrt(mean(x^2) + eps), back, times weight."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.rand(dim) + 0.5), eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_rms_norm_fuses(dtype):
    for module in (LlamaStyleRmsNorm(16).to(dtype), torch.nn.RMSNorm(16, eps=1e-5).to(dtype)):
        lowered = delegated(module, (torch.randn(2, 3, 16).to(dtype) * 3,), nodes=["RmsNorm"])
        assert "Power" not in lowered.nodes and "Rsqrt" not in lowered.nodes  # replaced, then removed


def test_rms_norm_look_alikes_do_not_fuse():
    def over_first_axis(x):
        return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)

    def cubed(x):
        return x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + 1e-6)

    def other_tensor(x, y):
        return y * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    for fn, inputs in ((over_first_axis, (torch.randn(4, 8),)), (cubed, (torch.rand(4, 8) + 1,)),
                       (other_tensor, (torch.randn(4, 8), torch.randn(4, 8)))):
        lowered = delegated(fn, inputs, nodes=["Rsqrt"])
        assert "RmsNorm" not in lowered.nodes
