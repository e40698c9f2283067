"""Parity of the convolution and pooling rules (channels-first in PyTorch, channels-last in MLX)."""

import pytest
import torch
import torch.nn.functional as F
from ruletest import FLOATS, declined, declined_reason, delegated, lowered_directly, untested_rules

CONVS = [
    # (conv, input shape)
    (torch.nn.Conv1d(4, 6, 3), (2, 4, 10)),
    (torch.nn.Conv1d(4, 8, 3, stride=2, padding=2, dilation=2, groups=2, bias=False), (1, 4, 11)),
    (torch.nn.Conv2d(3, 4, 3, padding=1), (2, 3, 6, 7)),
    (torch.nn.Conv2d(4, 4, (3, 2), stride=(2, 1), padding=(0, 1), dilation=(1, 2), groups=4), (1, 4, 9, 8)),
    (torch.nn.Conv3d(2, 3, 2, stride=(1, 2, 1), padding=1, bias=False), (1, 2, 4, 5, 3)),
]


@pytest.mark.parametrize(
    "index,dtype",
    [(i, FLOATS[i % 3]) for i in range(len(CONVS))],
    ids=["1d", "1d-strided-dilated-groups-nobias", "2d-padded", "2d-depthwise-mixed", "3d-nobias"],
)
def test_conv(index, dtype):
    conv, shape = CONVS[index]
    lowered = delegated(conv.to(dtype), (torch.randn(shape, dtype=dtype),), nodes=["Conv", "Transpose"])
    assert ("Add" in lowered.nodes) == (conv.bias is not None)


DEPTHWISE = [
    # (channels, multiplier, kernel, stride, padding, dilation, input spatial size): MLX's CPU
    # runs these as shifted products (runtime_shim/mlx_ops/convolution.py, both runtimes)
    (8, 1, 3, 1, 1, 1, (9, 10)),
    (6, 1, 7, 1, 3, 1, (14, 14)),  # ConvNeXt's
    (4, 1, 3, 2, 1, 1, (9, 8)),  # MobileNet's strided
    (5, 1, (3, 5), (2, 1), (0, 2), (2, 1), (11, 9)),
    (3, 2, 3, 1, 1, 1, (6, 7)),  # a channel multiplier: 2 outputs per input channel
    (4, 3, (1, 3), (1, 2), (0, 1), (1, 2), (5, 9)),
    (6, 1, 5, 1, 2, 1, (12,)),  # 1d
    (2, 2, 3, 2, 1, 1, (4, 5, 6)),  # 3d
]


@pytest.mark.parametrize("index", range(len(DEPTHWISE)))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_depthwise_conv(index, dtype):
    channels, multiplier, kernel, stride, padding, dilation, spatial = DEPTHWISE[index]
    conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[len(spatial) - 1](
        channels, channels * multiplier, kernel, stride=stride, padding=padding, dilation=dilation, groups=channels,
        bias=index % 2 == 0,
    )
    delegated(conv.to(dtype), (torch.randn(2, channels, *spatial, dtype=dtype),), nodes=["Conv"])


GROUPED = [
    # (in channels, out channels, groups, kernel, stride, padding, dilation, input spatial size): MLX's CPU
    # runs these as a batched matmul of the input's windows (both runtimes)
    (16, 16, 2, 3, 1, 1, 1, (9, 10)),  # RegNet's: groups of 8 channels
    (12, 18, 3, 3, 2, 1, 1, (9, 8)),  # more outputs than inputs per group, strided
    (8, 4, 4, (3, 5), (2, 1), (0, 2), (2, 1), (11, 9)),
    (6, 6, 3, 1, 1, 0, 1, (5, 7)),  # 1x1 (ShuffleNet's)
    (8, 8, 2, 5, 1, 2, 1, (12,)),  # 1d
    (4, 6, 2, 3, 2, 1, 1, (4, 5, 6)),  # 3d
]


@pytest.mark.parametrize("index", range(len(GROUPED)))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_grouped_conv(index, dtype):
    channels, outputs, groups, kernel, stride, padding, dilation, spatial = GROUPED[index]
    conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[len(spatial) - 1](
        channels, outputs, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups,
        bias=index % 2 == 0,
    )
    delegated(conv.to(dtype), (torch.randn(2, channels, *spatial, dtype=dtype),), nodes=["Conv"])


@pytest.mark.parametrize("groups", [1, 2, 4], ids=["dense", "grouped", "depthwise"])
def test_one_value_for_every_spatial_axis(groups):
    """``padding="valid"`` (EfficientNet's strided depthwise layers) reaches the graph as
    ``padding=[0]``, one value PyTorch applies to every spatial axis: lowered as one per
    axis, so both runtimes run what the export accepted."""
    conv = torch.nn.Conv2d(4, 4, 3, stride=2, padding="valid", groups=groups)
    delegated(conv, (torch.randn(1, 4, 9, 8),), nodes=["Conv"])


def test_conv_with_a_weight_computed_at_run_time():
    delegated(lambda x, w: F.conv2d(x, w, padding=1), (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)), nodes=["Conv"])


TRANSPOSED = [
    (torch.nn.ConvTranspose1d(4, 3, 3, stride=2), (2, 4, 7)),
    (torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), (1, 3, 4, 5)),
    (torch.nn.ConvTranspose2d(2, 4, (2, 3), stride=(2, 1), dilation=(1, 2), bias=False), (2, 2, 3, 4)),
    (torch.nn.ConvTranspose3d(2, 2, 2, stride=2), (1, 2, 2, 3, 2)),
]


@pytest.mark.parametrize(
    "index,dtype", [(i, FLOATS[i % 3]) for i in range(len(TRANSPOSED))],
    ids=["1d-strided", "2d-padded-output-padding", "2d-dilated-nobias", "3d"],
)
def test_transposed_conv(index, dtype):
    conv, shape = TRANSPOSED[index]
    lowered = delegated(conv.to(dtype), (torch.randn(shape, dtype=dtype),), nodes=["Conv"])
    assert ("Add" in lowered.nodes) == (conv.bias is not None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_grouped_transposed_conv(dtype):
    """MLX's transposed convolutions take one group: one per group, concatenated."""
    conv = torch.nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1, groups=2).to(dtype)
    lowered = delegated(conv, (torch.randn(1, 6, 4, 5, dtype=dtype),), nodes=["Concatenate"])
    assert lowered.nodes.count("Conv") == 2
    depthwise = torch.nn.ConvTranspose1d(3, 3, 4, stride=2, groups=3, bias=False).to(dtype)
    assert delegated(depthwise, (torch.randn(2, 3, 7, dtype=dtype),)).nodes.count("Conv") == 3


def test_3d_pooling():
    x = torch.randn(1, 2, 5, 6, 7)

    def fn(x):
        return (
            F.max_pool3d(x, 2), F.max_pool3d(x, 3, stride=2, padding=1, ceil_mode=True),
            F.avg_pool3d(x, 2), F.avg_pool3d(x, (3, 2, 3), stride=2, padding=1, count_include_pad=False),
            F.adaptive_avg_pool3d(x[:, :, :4], (2, 3, 7)),
        )

    delegated(fn, (x,), nodes=["Max", "Avg"])
    uneven = delegated(lambda x: F.adaptive_avg_pool3d(x, (2, 4, 3)), (x,), nodes=["Matmul"])  # 5, 6, 7 bins
    assert uneven.nodes.count("Matmul") == 3
    delegated(lambda x: F.max_pool3d(x, 2), (x.bfloat16(),), nodes=["Max"])  # PyTorch has no bf16 avg_pool3d


POOLS = {
    "max2d": lambda x: F.max_pool2d(x, 2),
    "max2d-pad-stride": lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
    "max2d-ceil": lambda x: F.max_pool2d(x, (3, 2), stride=2, ceil_mode=True),
    "max1d-pad-ceil": lambda x: F.max_pool1d(x.flatten(2), 3, stride=2, padding=1, ceil_mode=True),
    "avg2d": lambda x: F.avg_pool2d(x, 2),
    "avg2d-pad": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
    "avg2d-pad-exclude": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
    "avg2d-ceil": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),
    "avg2d-ceil-exclude": lambda x: F.avg_pool2d(x, 2, stride=2, ceil_mode=True, count_include_pad=False),
    "avg2d-divisor": lambda x: F.avg_pool2d(x, 2, padding=1, divisor_override=3),
    "avg1d": lambda x: F.avg_pool1d(x.flatten(2), 4, stride=3, padding=2, count_include_pad=False),
    "avg2d-kernel-past-input": lambda x: F.avg_pool2d(x, 50_000, ceil_mode=True),  # as EfficientNet's head
    "avg2d-kernel-past-exclude": lambda x: F.avg_pool2d(x, 40, padding=1, ceil_mode=True, count_include_pad=False),
    "max2d-kernel-past-input": lambda x: F.max_pool2d(x, (12, 2), stride=(12, 2), ceil_mode=True),
    "adaptive": lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
    "adaptive-1": lambda x: F.adaptive_avg_pool2d(x, 1),
}


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (2, 3, 6, 9)), (torch.float16, (1, 2, 4, 6)), (torch.bfloat16, (1, 2, 8, 3))], ids=str)
def test_pooling(dtype, shape):
    x = torch.randn(shape, dtype=dtype)
    delegated(lambda x: tuple(pool(x) for pool in POOLS.values()), (x,), nodes=["Max", "Avg", "Mean"])


def test_pooling_odd_sizes():
    """Sizes where the last ceil_mode window hangs past the input."""
    names = ["max2d-ceil", "avg2d-ceil", "avg2d-ceil-exclude", "avg2d-divisor", "max1d-pad-ceil",
             "avg2d-kernel-past-input", "avg2d-kernel-past-exclude", "max2d-kernel-past-input"]
    delegated(lambda x: tuple(POOLS[name](x) for name in names), (torch.randn(1, 2, 7, 5),), nodes=["Max", "Avg"])


def test_unbatched_pooling():
    """(C, *spatial) inputs, which PyTorch pools as a batch of one (they failed at run time,
    and an unbatched adaptive pool took a wrong kernel)."""

    def pools(x3, x4):
        return (
            F.avg_pool2d(x3, 2), F.max_pool2d(x3, (2, 3)), F.adaptive_avg_pool2d(x3, (4, 2)),
            F.avg_pool3d(x4, 2), F.max_pool3d(x4, 2), F.adaptive_avg_pool3d(x4, (1, 2, 3)),
            F.avg_pool1d(x3[0], 2), F.max_pool1d(x3[0], 3),
        )

    nodes = delegated(pools, (torch.randn(3, 8, 6), torch.randn(2, 4, 4, 6)), nodes=["ExpandDims", "Squeeze"]).nodes
    assert nodes.count("ExpandDims") >= 6


def test_dilated_max_pool_is_declined_but_correct():
    reason = declined(lambda x: F.max_pool2d(x, 2, dilation=2), (torch.randn(1, 2, 7, 7),), "aten::max_pool2d_with_indices")
    assert "dilated" in reason


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_uneven_adaptive_pool_is_a_matmul_per_axis(dtype):
    """A pyramid pooling module's bins (BEiT's and UperNet's heads): windows of varying
    size, one fixed matrix per axis, computed by PyTorch at export."""
    x = torch.randn(1, 2, 7, 8, dtype=dtype)
    pools = lambda x: tuple(F.adaptive_avg_pool2d(x, bins) for bins in (1, 2, 3, 6, (5, 3)))  # noqa: E731
    lowered = delegated(pools, (x,), nodes=["Matmul"])
    assert lowered.nodes.count("Matmul") == 8  # two per pool but the global one (a mean)
    delegated(lambda x: F.adaptive_avg_pool2d(x, 3), (x[0],), nodes=["Matmul"])  # unbatched


def test_adaptive_pool_of_a_dynamic_size_is_declined_but_correct():
    seq = torch.export.Dim("width", min=2, max=32)
    reason = declined(lambda x: F.adaptive_avg_pool2d(x, 3), (torch.randn(1, 2, 7, 8),), "aten::_adaptive_avg_pool2d",
                      dynamic_shapes=({3: seq},))
    assert "dynamic" in reason


def test_1d_pool_rules_lowered_directly():
    """Edge rewrites 1-d pooling as 2-d pooling today."""
    x = torch.randn(2, 3, 10)
    aten = torch.ops.aten
    max1d = lambda x: aten.max_pool1d_with_indices.default(x, [3], [2], [1], [1], True)[0]  # noqa: E731
    assert "Max" in lowered_directly(max1d, (x,))
    assert "Avg" in lowered_directly(lambda x: aten.avg_pool1d.default(x, [3], [2], [1], True, False), (x,))


FOLDS = [  # overlapping blocks with dilation and padding; disjoint ones
    dict(kernel_size=(3, 2), dilation=(1, 2), padding=(1, 0), stride=(2, 1)),
    dict(kernel_size=2, stride=2),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_fold(dtype):
    """``nn.Fold`` (col2im) of blocks ``F.unfold`` cut, summing where blocks overlap: as
    ExecuTorch decomposes it (index arithmetic, all on MLX), and whole by the rule."""
    for geometry in FOLDS:
        blocks = F.unfold(torch.randn(2, 3, 6, 8), **geometry).to(dtype)
        fold = lambda b, g=geometry: F.fold(b, (6, 8), **g)  # noqa: E731
        delegated(fold, (blocks,), nodes=["IndexPut"])
        assert "IndexPut" in lowered_directly(fold, (blocks,))


def test_every_convolution_rule_is_tested(whole_file):
    assert untested_rules("convolution") == set()
