"""The layout pass (lowering/layout.py): a region of elementwise work between
convolutions runs channels-last, without the transposes lowering put around each
convolution, and computes what it computed before."""

import pytest
import torch
from torch import nn

import runtimes
from lowering_harness import check_parity, lower

from etmlx.lowering import layout


class MBConvBlocks(nn.Module):
    """Two EfficientNet-style blocks: a padded strided convolution, batch norm and SiLU,
    a squeeze-and-excitation gate (a spatial mean and two 1x1 convolutions), a
    projection and a residual sum."""

    def __init__(self, channels=8):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=2, bias=False)
        self.blocks = nn.ModuleList(self._block(channels) for _ in range(2))
        self.head = nn.Conv2d(channels, 4, 1)

    @staticmethod
    def _block(channels):
        return nn.ModuleDict(dict(
            depthwise=nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
            norm=nn.BatchNorm2d(channels),
            squeeze=nn.Conv2d(channels, 4, 1),
            excite=nn.Conv2d(4, channels, 1),
            project=nn.Conv2d(channels, channels, 1, bias=False),
            project_norm=nn.BatchNorm2d(channels),
        ))

    def forward(self, x):
        x = self.stem(nn.functional.pad(x, (0, 1, 0, 1)))
        for block in self.blocks:
            h = nn.functional.silu(block["norm"](block["depthwise"](x)))
            gate = torch.sigmoid(block["excite"](nn.functional.silu(block["squeeze"](h.mean((2, 3), keepdim=True)))))
            x = x + block["project_norm"](block["project"](h * gate))
        return self.head(x).mean((2, 3))


def _with_statistics(module):
    """Batch norms with running statistics other than 0 and 1, so their constants count."""
    generator = torch.Generator().manual_seed(0)
    for norm in module.modules():
        if isinstance(norm, nn.BatchNorm2d):
            norm.running_mean.copy_(torch.randn(norm.num_features, generator=generator))
            norm.running_var.copy_(torch.rand(norm.num_features, generator=generator) + 0.5)
    return module.eval()


def _transposes(lowered) -> int:
    return lowered.nodes.count("Transpose")


@pytest.fixture(scope="module")
def blocks():
    torch.manual_seed(0)
    return _with_statistics(MBConvBlocks()), (torch.randn(1, 3, 17, 17),)


def test_a_network_of_convolutions_keeps_only_its_ends_transposes(blocks):
    module, inputs = blocks
    lowered = check_parity(module, inputs)  # both runtimes, against eager
    # The input into channels-last, and nothing else: the head's mean over the spatial
    # axes reads the channels-last result directly (the same (N, C) array).
    assert _transposes(lowered) == 1, lowered.nodes
    assert lowered.nodes.count("Conv") == 10


def test_the_pass_changes_nothing_but_where_values_lie(blocks, monkeypatch):
    module, inputs = blocks
    with_pass = lower(module, inputs)
    monkeypatch.setattr("etmlx.lowering.preprocess.cancel_transposes", lambda graph, ranks: None)
    without = lower(module, inputs)
    assert _transposes(without) == 20  # one each way around each convolution
    assert sorted(n for n in with_pass.nodes if n != "Transpose") == sorted(n for n in without.nodes if n != "Transpose")
    # Elementwise work is equal to the bit in either layout; the means sum in another order.
    expected = runtimes.load(without.pte).forward(*inputs)
    torch.testing.assert_close(runtimes.load(with_pass.pte).forward(*inputs), expected, rtol=1e-6, atol=1e-6)


def test_a_region_that_would_add_transposes_stays_as_it_is():
    """A convolution's activations returned three ways and fed to another convolution:
    the region would save two transposes (into it, and into the second convolution) but
    add one for each of its three outputs."""

    class Returned(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 1)

        def forward(self, x):
            h = torch.relu(self.first(x))
            return h, torch.sigmoid(h), torch.tanh(h), self.second(h)

    lowered = check_parity(Returned(), (torch.randn(1, 3, 8, 8),))
    assert _transposes(lowered) == 4, lowered.nodes


def test_an_input_of_the_graph_joins_a_region_through_a_transpose():
    """A residual from the graph's input: the input joins the region through one transpose,
    which the first convolution reads as well (its own transpose of the input goes), and
    the two around the first convolution's sum go."""

    class FromInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 3)

        def forward(self, x):
            return self.second(torch.relu(self.first(x) + x))

    lowered = check_parity(FromInput(), (torch.randn(1, 4, 8, 8),))
    assert _transposes(lowered) == 2, lowered.nodes  # 4 without the pass


def test_a_constant_whose_bytes_would_move_keeps_the_transposes():
    """A positional (C, H, W) table added between two convolutions cannot be re-shaped
    into channels-last without moving its bytes: the region is left as it is."""

    class Positional(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 1)
            self.table = nn.Parameter(torch.randn(4, 6, 6))

        def forward(self, x):
            return self.second(self.first(x) + self.table)

    lowered = check_parity(Positional(), (torch.randn(1, 3, 8, 8),))
    assert _transposes(lowered) == 4, lowered.nodes


@pytest.mark.parametrize("shape,expected", [
    ([4, 1, 1], [1, 1, 1, 4]),  # a channel's scale: the same bytes
    ([1, 4, 1, 1], [1, 1, 1, 4]),
    ([], [1, 1, 1, 1]),
    ([4, 6, 6], None),  # C, H, W -> H, W, C moves bytes
    ([1, 1, 6], [1, 1, 6, 1]),
])
def test_a_constant_is_reshaped_only_where_its_bytes_stay_in_order(shape, expected):
    to_channels_last = [0, 2, 3, 1]  # the inverse of the transpose into a region, (0, 3, 1, 2)
    assert layout._shape_in_layout(shape, to_channels_last) == expected


def test_pad_widths_follow_the_axes():
    class Op:
        padWidth = [0, 0, 1, 2, 3, 4, 5, 6]  # (N, C, H, W): C by (1, 2), H (3, 4), W (5, 6)

    op = Op()
    layout._pad_widths(op, [0, 3, 1, 2])  # held as (N, H, W, C)
    assert op.padWidth == [0, 0, 3, 4, 5, 6, 1, 2]
