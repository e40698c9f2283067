"""Parity of the shape rules: views, permutations, slicing, concatenation, gathers,
static and dynamic (SymInt sizes read at run time)."""

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim
from ruletest import FLOATS, declined, delegated, dtype_shape_cases, lowered_directly, untested_rules

aten = torch.ops.aten


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(2, 3, 4), (1, 5, 2), (4, 1, 6)]))
def test_view_permute_unsqueeze_squeeze(dtype, shape):
    x = torch.randn(shape, dtype=dtype)
    a, b, c = shape

    def fn(x):
        return (
            x.view(a * b, c),
            x.reshape(-1),
            x.permute(2, 0, 1),
            x.transpose(-1, 0),
            x.mT,
            x.unsqueeze(-1),
            x.unsqueeze(1),
            x.unsqueeze(0).squeeze(0),
            x[:, None].squeeze(),  # squeezes every size-1 dim
            x.squeeze(1),
            x.clone(),
            x.to(torch.float32) + 1,
            x.to(torch.int32),
        )

    delegated(fn, (x,), nodes=["Reshape", "Transpose", "ExpandDims", "Squeeze", "AsType"])


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(6, 7), (5, 4, 9)]))
def test_slice_and_select(dtype, shape):
    x = torch.randn(shape, dtype=dtype)

    def fn(x):
        return (
            x[1:],
            x[-2:],
            x[:-1],
            x[::2],
            x[:, 1::3],
            x[..., -3:-1],
            x[:, None:None:2],
            x[:, :100],  # an end past the size clamps
            x[:, -100:2],
            x.narrow(-1, 1, 2),
            x[-1],
            x[:, -2],
            x[1, 2],
        )

    lowered = delegated(fn, (x,), nodes=["Slice", "Squeeze"])
    assert set(lowered.nodes) <= {"Slice", "Squeeze"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64], ids=str)
def test_split_unbind_cat_stack(dtype):
    x = torch.arange(2 * 5 * 3).reshape(2, 5, 3).to(dtype)
    y = torch.arange(2 * 2 * 3).reshape(2, 2, 3).to(dtype)

    def fn(x, y):
        return (
            *x.split(2, dim=1),  # uneven: 2, 2, 1
            *x.split([1, 4], dim=-2),
            *aten.split_copy.Tensor(x, 3, 1),
            *aten.split_with_sizes_copy(x, [1, 4], 1),  # (split and chunk become slices before to_edge)
            *x.unbind(0),
            *x.unbind(-1),
            *x.chunk(2, dim=1),
            torch.cat([x, y, x], dim=1),
            torch.cat([x, x], dim=-1),
            torch.stack([x, x], dim=1),
        )

    delegated(fn, (x, y), nodes=["Slice", "Squeeze", "Concatenate"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_expand(dtype):
    x = torch.randn(3, 1, dtype=dtype)

    def fn(x):
        return x.expand(4, -1, 5), x.expand(3, 2), x[:, None].expand(-1, 5, 2), x.expand_as(torch.empty(2, 3, 7))

    delegated(fn, (x,), exact=["BroadcastTo", "BroadcastTo", "ExpandDims", "BroadcastTo", "BroadcastTo"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_repeat(dtype):
    x = torch.randint(0, 9, (2, 3)).to(dtype)
    delegated(lambda x: (x.repeat(2, 1), x.repeat(3, 1, 2)), (x,), nodes=["Tile"])  # 3 reps for 2 dims: one new


# ---------------------------------------------------------------- dynamic shapes
def test_dynamic_view_expand_slice():
    seq = Dim("seq", min=4, max=64)

    def fn(x, y):
        batch, n, d = x.shape
        return (
            x.reshape(-1, d) * 2,
            x.flatten(1),
            x.view(batch, n, 2, d // 2).transpose(1, 2),
            y.expand(batch, n, d) + x,
            x[:, 1:],
            x[:, : n - 1],
            x[:, -2:],  # a negative start on a dynamic dim
            x[:, ::2],
            x.unsqueeze(1).expand(-1, 3, -1, -1),
        )

    x, y = torch.randn(2, 5, 4), torch.randn(1, 1, 4)
    lowered = delegated(
        fn,
        (x, y),
        dynamic_shapes=({1: seq}, None),
        run_with=[(torch.randn(2, 9, 4), y), (torch.randn(2, 4, 4), y)],
        nodes=["Reshape", "BroadcastTo", "Slice", "SymSize"],
    )
    assert lowered.kernels == []


def test_dynamic_batch_and_seq_cat_and_select():
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=32)

    def fn(x):
        return torch.cat([x, x * 2], dim=1), x[:, 0], x[0], torch.cat([x, x], dim=0).sum(0)

    x = torch.randn(2, 3, 4)
    delegated(
        fn,
        (x,),
        dynamic_shapes=({0: batch, 1: seq},),
        run_with=[(torch.randn(3, 7, 4),), (torch.randn(1, 2, 4),)],
        nodes=["Concatenate", "Slice", "Squeeze"],
    )


def test_split_along_a_static_dim_keeps_the_others_dynamic():
    """ExecuTorch's to_edge would fix the number of tokens to the example's 5 for a
    split or chunk along the feature dim of (tokens, features) (a mixture of experts'
    gate/up halves); etmlx exports them as slices, so other counts still run."""
    tokens = Dim("tokens", min=2, max=32)

    def fn(x):
        x = x * 2
        gate, up = x.chunk(2, dim=-1)
        first, second, rest = x.split([3, 3, 2], dim=1)
        thirds = x.split(3, dim=-1)  # uneven: 3, 3, 2
        return gate * up, first + second, rest, *thirds

    delegated(
        fn, (torch.randn(5, 8),), dynamic_shapes=({0: tokens},),
        run_with=[(torch.randn(17, 8),), (torch.randn(2, 8),)], nodes=["Slice"],
    )


def test_negative_select_on_a_dynamic_dim_is_declined_but_correct():
    seq = Dim("seq", min=2, max=32)
    reason = declined(
        lambda x: x[:, -1] * 2, (torch.randn(2, 5, 3),), "aten::select_copy.int", dynamic_shapes=({1: seq},)
    )
    assert "negative" in reason


def test_rules_that_edge_decomposes_lowered_directly():
    """Functionalization and edge's decompositions never produce these today; their
    rules must still compute what eager does."""
    x = torch.randn(2, 1, 3)
    m = torch.randn(4, 5)
    assert lowered_directly(lambda x: aten.reshape.default(x, [3, 2]), (x,)) == ["Reshape"]
    assert lowered_directly(lambda x: aten._unsafe_view.default(x, [6]), (x,)) == ["Reshape"]
    assert lowered_directly(lambda m, v: (aten.t_copy.default(m), aten.t_copy.default(v)), (m, m[0])) == ["Transpose"]
    assert lowered_directly(lambda x: aten.transpose_copy.int(x, 0, -1), (x,)) == ["Transpose"]
    assert lowered_directly(lambda x: aten.squeeze_copy.dim(x, 1), (x,)) == ["Squeeze"]
    assert lowered_directly(lambda x: aten.squeeze_copy.default(x), (x,)) == ["Squeeze"]
    assert lowered_directly(lambda x: aten.squeeze_copy.dim(x, 0), (x,)) == []  # size 2: no-op
    assert lowered_directly(lambda x: aten.squeeze_copy.dims(x, [0, 1]), (x,)) == ["Squeeze"]
    assert lowered_directly(lambda x: aten.unbind_copy.int(x, -1), (x,)) == ["Slice", "Squeeze"] * 3
    assert lowered_directly(lambda x: aten.clone.default(x), (x,)) == []
    assert lowered_directly(lambda x: aten.detach_copy.default(x), (x,)) == []
    assert lowered_directly(lambda x: aten._to_copy.default(x, dtype=torch.bfloat16), (x,)) == ["AsType"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_pad_flip_and_nearest_upsampling(dtype):
    x = (torch.randn(2, 3, 4, 5) * 4).to(dtype)
    import torch.nn.functional as F

    def fn(x):
        return (
            F.pad(x, (1, 2), value=3),
            F.pad(x, (0, 1, 2, 0)),
            torch.flip(x, [1, -1]),
            F.interpolate(x, scale_factor=2, mode="nearest") if dtype.is_floating_point else x,
            F.interpolate(x, size=(8, 15), mode="nearest") if dtype.is_floating_point else x,
        )

    lowered = delegated(fn, (x,), nodes=["Pad", "Take"])
    assert "BroadcastTo" in lowered.nodes or not dtype.is_floating_point


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_upsampling(dtype, align_corners):
    import torch.nn.functional as F

    x = torch.randn(2, 3, 4, 5).to(dtype)

    def fn(x):
        return (
            F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=align_corners),
            F.interpolate(x, size=(7, 3), mode="bilinear", align_corners=align_corners),
            F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=align_corners),
        )

    delegated(fn, (x,), nodes=["Take"])


@pytest.mark.parametrize("align_corners", [False, True])
def test_antialiased_resizing_is_a_matmul_per_axis(align_corners):
    """``antialias=True`` (TIPSv2's DPT head): down and up, sizes and scale factors.
    (PyTorch's CPU kernels take float32 and float64 only.)"""
    import torch.nn.functional as F

    x = torch.randn(2, 3, 12, 10)

    def fn(x):
        return tuple(
            F.interpolate(x, mode=mode, antialias=True, align_corners=align_corners, **size)
            for mode in ("bilinear", "bicubic")
            for size in (dict(size=(5, 4)), dict(scale_factor=0.3), dict(size=(17, 10)))
        )

    lowered = delegated(fn, (x,), nodes=["Matmul"])
    assert lowered.nodes.count("Matmul") == 12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_nearest_resizing_by_any_factor_indexes_as_pytorch(dtype):
    """Fractional factors up and down, sizes and scale factors (PyTorch computes those
    differently), DETR's mask resize 64 -> 2: gathers of the rows PyTorch's kernel picks."""
    x = (torch.randn(2, 3, 7, 64) * 8).to(dtype)
    nearest = aten.upsample_nearest2d.vec

    def fn(x):
        return (
            nearest(x, None, [1.5, 0.3]),
            nearest(x, [10, 2], None),
            nearest(x, [3, 64], None),
            nearest(x, None, [2.0, 1.0 / 3.0]),
            nearest(x, [21, 5], None),  # 3x up on one axis, 64 -> 5 on the other
        )

    lowered = delegated(fn, (x,), nodes=["Take", "BroadcastTo"])
    assert lowered.kernels == []


def test_nearest_exact_and_one_dimensional_resizing_stay_on_mlx():
    """Modes and ranks ExecuTorch decomposes into index arithmetic, which MLX computes as
    PyTorch does."""
    import torch.nn.functional as F

    x = torch.randn(2, 3, 7, 9)

    def fn(x):
        return (
            F.interpolate(x, scale_factor=1.5, mode="nearest-exact"),
            F.interpolate(x, size=(3, 20), mode="nearest-exact"),
            F.interpolate(x[:, :, 0], size=13, mode="nearest"),
            F.interpolate(x[:, :, 0], size=4, mode="nearest-exact"),
        )

    assert delegated(fn, (x,)).kernels == []


def test_nearest_resizing_of_a_dynamic_size_is_declined_but_correct():
    import torch.nn.functional as F

    x = torch.randn(1, 2, 4, 6)
    dynamic = ({3: torch.export.Dim("w", min=2, max=16)},)
    declined(lambda x: F.interpolate(x, size=(5, 3), mode="nearest"), (x,), "aten::upsample_nearest2d.vec",
             dynamic_shapes=dynamic)


def test_negative_padding_crops():
    """PyTorch crops where a pad width is negative; so does the lowering, on static and
    dynamic dims (ExecuTorch's own kernel rejects negative widths)."""
    import torch.nn.functional as F

    x = torch.randn(1, 2, 5, 6)
    assert delegated(lambda x: F.pad(x, (-1, 2)), (x,), exact=["Slice", "Pad"])
    delegated(lambda x: F.pad(x, (-2, -1, 1, -3), value=0.5), (x,), exact=["Slice", "Slice", "Pad"])
    delegated(lambda x: F.pad(x, (0, -2)), (x,), exact=["Slice"])
    dynamic = ({3: torch.export.Dim("w", min=5, max=16)},)
    delegated(lambda x: F.pad(x, (-1, -2)), (x,), exact=["Slice"], dynamic_shapes=dynamic,
              run_with=[(torch.randn(1, 2, 5, 9),)])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8], ids=str)
@pytest.mark.parametrize("source", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_float_to_integer_casts_match_pytorch_for_every_value(source, dtype):
    """NaN, infinities and values past the target's range cast as PyTorch casts them (a
    plain cast of those is undefined in the C++ mx.compile generates)."""
    values = [float("nan"), float("inf"), -float("inf"), -1e30, 1e30, 3.7, -3.7, 200.5, -129.0, 3e9, -3e9, 70000.0]
    x = torch.tensor(values).to(source)
    delegated(lambda x: x.to(dtype), (x,), exact=["AsType"])


def test_reflection_and_replication_padding():
    """ExecuTorch decomposes these into index arithmetic (which runs on MLX too); kept
    whole, each is a gather per axis with indices computed at export."""
    aten = torch.ops.aten
    x = torch.arange(2 * 4 * 5 * 6, dtype=torch.float32).reshape(1, 2, 4, 5, 6)
    pads = [
        lambda x: aten.reflection_pad1d.default(x[0, :, 0], [2, 3]),
        lambda x: aten.reflection_pad2d.default(x[0], [1, 2, 4, 0]),
        lambda x: aten.reflection_pad3d.default(x, [1, 1, 2, 0, 3, 1]),
        lambda x: aten.replication_pad1d.default(x[0, :, 0], [4, 0]),
        lambda x: aten.replication_pad2d.default(x[0], [0, 3, 2, 2]),
        lambda x: aten.replication_pad3d.default(x, [2, 0, 0, 1, 1, 1]),
    ]
    for pad in pads:
        assert "Take" in lowered_directly(pad, (x,))
    delegated(lambda x: (F.pad(x[0], (1, 2, 4, 0), mode="reflect"), F.pad(x, (2, 0, 0, 1, 1, 1), mode="replicate")), (x,))


@pytest.mark.parametrize("dtype,shape", dtype_shape_cases([(4, 6), (3, 4, 5)], [*FLOATS, torch.int32]))
def test_diagonal(dtype, shape):
    x = torch.randn(shape).mul(10).to(dtype)
    diagonals = [lambda x: torch.diagonal(x), lambda x: torch.diagonal(x, 2), lambda x: torch.diagonal(x, -1, -1, 0),
                 lambda x: torch.diagonal(x, 9)]  # off the plane: empty
    delegated(lambda x: tuple(d(x) for d in diagonals) + (torch.diagonal(x, 1) * 2,), (x,), nodes=["Take"])


def test_diagonal_with_a_dynamic_batch():
    x = torch.randn(3, 4, 5)
    delegated(lambda x: torch.diagonal(x, 1, 1, 2) * 2, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=8)},))


def test_as_strided_views_are_reshapes_permutations_and_broadcasts():
    """What ConvNeXt and Swin leave after pooling a channels-last view, and views of the
    same kinds: dims of size 1 restrided, permuted blocks, an offset, broadcast dims."""
    x = torch.randn(2, 3, 4, 5)

    def fn(x):
        pooled = x.mean(dim=(-1, -2), keepdim=True)
        return (
            aten.as_strided_copy(pooled, [2, 3, 1, 1], [3, 1, 3, 3]),  # ConvNeXt's
            aten.as_strided_copy(x, [5, 4, 3, 2], [1, 5, 20, 60]),  # a permutation
            aten.as_strided_copy(x, [2, 7], [7, 1], 11),  # a block at an offset
            aten.as_strided_copy(x, [3, 4, 5], [0, 5, 1], 60),  # broadcast along the first dim
        )

    lowered = delegated(fn, (x,), nodes=["Reshape", "Transpose", "Slice", "BroadcastTo"])
    assert lowered.kernels == []


def test_as_strided_overlapping_windows_are_declined_but_correct():
    x = torch.randn(10)
    declined(lambda x: aten.as_strided_copy(x, [4, 3], [2, 1]), (x,), "aten::as_strided_copy")
    declined(lambda x: aten.as_strided_copy(x, [3], [3]), (x,), "aten::as_strided_copy")


def test_every_shape_rule_is_tested(whole_file):
    assert untested_rules("shape") == set()
