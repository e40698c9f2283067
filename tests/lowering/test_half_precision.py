"""Half precision across the rule families: calls each family's file tests in float32
(or one half dtype) only, run in float16 and bfloat16 against eager PyTorch, on both
runtimes. (Found by recording, per rule, the dtypes the lowering tests delegate.)"""

import pytest
import torch
import torch.nn.functional as F
from ruletest import delegated


def _image(dtype):
    return ((torch.randn(2, 3, 8, 8) * 2).to(dtype),)


def _pads(x):
    rows = x[0]
    return (
        F.pad(rows, (1, 2), mode="reflect"), F.pad(rows, (1, 2), mode="replicate"),
        F.pad(x, (1, 1, 2, 0), mode="replicate"), F.pad(x, (1, 2, 1, 1), mode="reflect"), F.pad(x, (1, 2), value=3.0),
    )


def _reductions(x):
    return torch.cumsum(x, -1), x.var(-1), x.prod(-1), x.sum(), x.max(), x.min()


def _elementwise(x):
    return (
        F.silu(x), 2.0**x, 3 - x, torch.trunc(x), x.isnan(), x.isinf(), x % 1.5, torch.remainder(x, x.flip(-1) + 5),
        x / 3, x - 2, x * 2, x + 1,
    )


def _comparisons(x):
    return x >= 0.5, x > x.flip(-1), x <= 0.1, x < x.flip(-1), x != x.flip(-1), torch.logical_xor(x > 0, x < 1)


def _shapes(x):
    columns = torch.full((2, 3, 8, 2), 3, dtype=torch.long)
    return x.flip(-1), torch.gather(x, -1, columns), torch.roll(x, 2, -1), x.transpose(-1, -2) @ x, torch.matmul(x, x)


def _upsampling(x):
    return F.interpolate(x, scale_factor=2, mode="bilinear"), F.interpolate(x, scale_factor=2, mode="nearest")


def _scatters(x):
    index = torch.tensor([0, 1, 1]).expand(2, 3, 8, 3)
    return (
        x.scatter_add(-1, index, x[..., :3]), x.scatter(-1, index[..., :2], 2.5),
        x.scatter_reduce(-1, index, x[..., :3], "amax"), x.index_put((torch.tensor([0, 1]),), torch.ones(3, 8, 8, dtype=x.dtype)),
        torch.slice_scatter(x, x[..., :2] * 2, -1, 0, 2), torch.select_scatter(x, x[..., 0] * 2, -1, 0),
        x.masked_scatter(x > 0, x * 3),
    )


def _pooling_1d(x):
    return F.avg_pool1d(x, 2), F.max_pool1d(x, 3, 2)


CASES = {  # (function, inputs by dtype, IR nodes that must be serialized)
    "pads": (_pads, _image, ["Pad"]),
    "reductions": (_reductions, _image, ["CumSum", "Variance", "Prod", "Sum", "Max", "Min"]),
    "elementwise": (_elementwise, _image, ["Sigmoid", "Power", "Ceil", "Floor", "IsNan", "IsInf", "Remainder"]),
    "comparisons": (_comparisons, _image, ["GreaterEqual", "Greater", "LessEqual", "Less", "NotEqual"]),
    "shapes": (_shapes, _image, ["TakeAlongAxis", "Roll", "Matmul"]),
    "upsampling": (_upsampling, _image, ["Take", "BroadcastTo"]),  # gathers at places fixed at export
    "scatters": (_scatters, _image, ["IndexPut", "CheckIndex"]),
    "pooling 1d": (_pooling_1d, lambda dtype: (torch.randn(2, 3, 9).to(dtype),), ["Avg", "Max"]),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("case", CASES)
def test_half_precision(case, dtype):
    torch.manual_seed(0)
    fn, inputs, nodes = CASES[case]
    delegated(fn, inputs(dtype), nodes=nodes)
