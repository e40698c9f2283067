"""One sample call per lowering rule, for the dtype walk (``test_dtype_walk.py``).

Each sample calls its rule's operator itself (``torch.ops.aten.<op>.<overload>``), so the
operator reaches the partitioner whole whatever ExecuTorch would decompose, and takes
``(x, y, d)`` of the dtype under test: ``x`` signed values, ``y`` positive ones (a
divisor, an exponent), ``d`` distinct ones (sorting without ties). Operands of other
kinds (indices, weights of a quantized layer) are built in the sample. A sample may
branch on the dtype only to keep its call one that PyTorch computes.
"""

import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  (registers dim_order_ops::)
from executorch.extension.llm.export import int4  # noqa: F401  (registers torchao::dequantize_int4_tensor)

from delegate_ops import upstream_ops  # noqa: F401  (defines ExecuTorch's MLX delegate's mlx:: operators)
from etmlx.quant import mxfp4  # noqa: F401  (registers etmlx::dequantize_mxfp4)
from etmlx.lowering import custom_ops  # noqa: F401  (registers etmlx:: operators)

aten = torch.ops.aten
etmlx = torch.ops.etmlx

# Rules without a tensor dtype to walk: they compute sizes (SymInts), tested in test_sizes.py.
SIZE_RULES = {"_operator.add", "_operator.floordiv", "_operator.mod", "_operator.mul", "_operator.neg", "_operator.sub",
              "aten::sym_size.int"}

# Operators that never reach the partitioner as called (torch.export and ExecuTorch's
# edge passes rewrite them), registered with the same rule as what they become: walked
# as that.
REWRITTEN = {
    "aten::clone": "dim_order_ops::_clone_dim_order",
    "aten::_to_copy": "dim_order_ops::_to_dim_order_copy",
    "aten::reshape": "aten::view_copy",
    "aten::_unsafe_view": "aten::view_copy",
}


def _long(*values):
    return torch.tensor(values, dtype=torch.long)


def _quantized(dtype, rows=8, columns=64, group=32):
    """int4 codes, per-group scale (in ``dtype``) and zero point, as torchao stores them."""
    codes = torch.randint(-8, 8, (rows, columns), dtype=torch.int8)
    scale = (torch.rand(rows, columns // group) / 8 + 0.01).to(dtype)
    zero = torch.randint(-2, 2, (rows, columns // group), dtype=torch.int8)
    return codes, scale, zero


UNARY = [
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bitwise_not", "ceil", "cos", "cosh", "erf", "exp",
    "expm1", "floor", "isinf", "isnan", "log", "log10", "log1p", "log2", "logical_not", "neg", "reciprocal", "relu",
    "round", "rsqrt", "sigmoid", "sign", "silu", "sin", "sinh", "sqrt", "tan", "tanh", "trunc", "elu", "gelu",
]
BINARY_TENSOR = [
    "atan2", "bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor", "div.Tensor", "eq.Tensor", "floor_divide",
    "fmod.Tensor", "ge.Tensor", "gt.Tensor", "le.Tensor", "logical_and", "logical_or", "logical_xor", "lt.Tensor",
    "maximum", "minimum", "mul.Tensor", "ne.Tensor", "remainder.Tensor", "sub.Tensor", "add.Tensor", "pow.Tensor_Tensor",
]
BINARY_SCALAR = [
    "add.Scalar", "bitwise_and.Scalar", "bitwise_or.Scalar", "bitwise_xor.Scalar", "div.Scalar", "eq.Scalar",
    "fmod.Scalar", "ge.Scalar", "gt.Scalar", "le.Scalar", "lt.Scalar", "mul.Scalar", "ne.Scalar", "remainder.Scalar",
    "rsub.Scalar", "sub.Scalar", "pow.Tensor_Scalar",
]


CASTS = (torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32)


def _overload(name):
    op, _, overload = name.partition(".")
    packet = getattr(aten, op)
    return getattr(packet, overload or "default")


def _unary(name):
    op = _overload(name)
    return lambda x, y, d: op(x)


def _binary(name):
    op = _overload(name)
    return lambda x, y, d: op(x, y)


def _scalar(name):
    op = _overload(name)
    return lambda x, y, d: op(x, 2)


def _elementwise():
    samples = {f"aten::{n}": _unary(n) for n in UNARY}
    samples |= {f"aten::{n}": _binary(n) for n in BINARY_TENSOR}
    samples |= {f"aten::{n}": _scalar(n) for n in BINARY_SCALAR}
    samples |= {
        "aten::pow.Scalar": lambda x, y, d: aten.pow.Scalar(2, y),
        "aten::div.Scalar_mode": lambda x, y, d: aten.div.Scalar_mode(x, 3, rounding_mode="floor"),
        "aten::div.Tensor_mode": lambda x, y, d: (
            aten.div.Tensor_mode(x, y, rounding_mode="trunc"), aten.div.Tensor_mode(x, y, rounding_mode="floor")
        ),
        "aten::clamp": lambda x, y, d: aten.clamp(x, -1, 2),
        "aten::clamp.Tensor": lambda x, y, d: aten.clamp.Tensor(x, -y, y),
        "aten::hardtanh": lambda x, y, d: aten.hardtanh(x, -1.5, 1.0),
        "aten::leaky_relu": lambda x, y, d: aten.leaky_relu(x, 0.1),
        "aten::where.self": lambda x, y, d: aten.where.self(x > 0, x, y),
    }
    return samples


def _shape():
    return {
        "aten::alias_copy": lambda x, y, d: aten.alias_copy(x),
        "aten::cat": lambda x, y, d: aten.cat([x, y], 1),
        "aten::copy": lambda x, y, d: aten.copy(x, y),
        "aten::detach_copy": lambda x, y, d: aten.detach_copy(x),
        "aten::diagonal_copy": lambda x, y, d: aten.diagonal_copy(x, 1, 2, 3),
        "aten::as_strided_copy": lambda x, y, d: aten.as_strided_copy(x, [4, 3, 1], [1, 4, 7], 2),
        "aten::expand_copy": lambda x, y, d: aten.expand_copy(x[:, :1], [2, 3, 4, 5]),
        "aten::permute_copy": lambda x, y, d: aten.permute_copy(x, [3, 1, 0, 2]),
        "aten::repeat": lambda x, y, d: aten.repeat(x, [1, 2, 1, 2]),
        "aten::select_copy.int": lambda x, y, d: aten.select_copy.int(x, 2, -1),
        "aten::slice_copy.Tensor": lambda x, y, d: aten.slice_copy.Tensor(x, 3, 1, 5, 2),
        "aten::split_copy.Tensor": lambda x, y, d: tuple(aten.split_copy.Tensor(x, 2, 3)),
        "aten::split_with_sizes_copy": lambda x, y, d: tuple(aten.split_with_sizes_copy(x, [1, 3], 2)),
        "aten::squeeze_copy": lambda x, y, d: aten.squeeze_copy(x[:, :1]),
        "aten::squeeze_copy.dim": lambda x, y, d: aten.squeeze_copy.dim(x[:, :1], 1),
        "aten::squeeze_copy.dims": lambda x, y, d: aten.squeeze_copy.dims(x[:1, :1], [0, 1]),
        "aten::t_copy": lambda x, y, d: aten.t_copy(x[0, 0]),
        "aten::transpose_copy.int": lambda x, y, d: aten.transpose_copy.int(x, 1, 3),
        "aten::unbind_copy.int": lambda x, y, d: tuple(aten.unbind_copy.int(x, 1)),
        "aten::unsqueeze_copy": lambda x, y, d: aten.unsqueeze_copy(x, 2),
        "aten::view_copy": lambda x, y, d: aten.view_copy(x, [2, 12, 5]),
        "aten::flip": lambda x, y, d: aten.flip(x, [1, 3]),
        "aten::constant_pad_nd": lambda x, y, d: aten.constant_pad_nd(x, [1, 2, 0, 1], 3),
        "aten::reflection_pad1d": lambda x, y, d: aten.reflection_pad1d(x[0], [2, 1]),
        "aten::reflection_pad2d": lambda x, y, d: aten.reflection_pad2d(x, [2, 1, 1, 2]),
        "aten::reflection_pad3d": lambda x, y, d: aten.reflection_pad3d(x, [1, 1, 2, 1, 1, 0]),
        "aten::replication_pad1d": lambda x, y, d: aten.replication_pad1d(x[0], [2, 1]),
        "aten::replication_pad2d": lambda x, y, d: aten.replication_pad2d(x, [2, 1, 1, 2]),
        "aten::replication_pad3d": lambda x, y, d: aten.replication_pad3d(x, [1, 1, 2, 1, 1, 0]),
        "etmlx::roll": lambda x, y, d: etmlx.roll(x, [1, -2], [1, 3]),
        "dim_order_ops::_clone_dim_order": lambda x, y, d: torch.ops.dim_order_ops._clone_dim_order(x, dim_order=[0, 1, 2, 3]),
        "dim_order_ops::_to_dim_order_copy": lambda x, y, d: tuple(
            torch.ops.dim_order_ops._to_dim_order_copy(x, dtype=dtype, dim_order=[0, 1, 2, 3]) for dtype in CASTS
        ),
    }


def _indexing():
    rows = _long(0, 2, 1, 2)
    columns = torch.randint(0, 5, (2, 3, 4, 2))
    return {
        "aten::embedding": lambda x, y, d: aten.embedding(x[0, 0], _long(3, 0, 1, 3)),
        "aten::gather": lambda x, y, d: aten.gather(x, 3, columns),
        "aten::index.Tensor": lambda x, y, d: aten.index.Tensor(x, [None, rows]),
        "aten::index_put": lambda x, y, d: aten.index_put(x, [_long(1, 0)], y[:1]),
        "aten::index_select": lambda x, y, d: aten.index_select(x, 1, rows),
        "aten::masked_scatter": lambda x, y, d: aten.masked_scatter(x, y > y.mean(), -y) if x.dtype.is_floating_point
        else aten.masked_scatter(x, x > 0, y),
        "aten::scatter.value": lambda x, y, d: aten.scatter.value(x, 3, _long(0, 2, 2).expand(2, 3, 4, 3), 1),
        "aten::scatter_add": lambda x, y, d: aten.scatter_add(x, 3, _long(0, 2, 2).expand(2, 3, 4, 3), y[..., :3]),
        "aten::scatter_reduce.two": lambda x, y, d: tuple(
            aten.scatter_reduce.two(x, 3, _long(0, 2, 2).expand(2, 3, 4, 3), y[..., :3], reduce)
            for reduce in ("sum", "prod", "amax", "amin", "mean")
        ),
        "aten::select_scatter": lambda x, y, d: aten.select_scatter(x, y[:, 0], 1, 2),
        "aten::slice_scatter": lambda x, y, d: aten.slice_scatter(x, y[..., :2], 3, 1, 5, 2),
    }


def _reduction():
    return {
        "aten::all": lambda x, y, d: aten.all(x),
        "aten::all.dim": lambda x, y, d: aten.all.dim(x, 1),
        "aten::all.dims": lambda x, y, d: aten.all.dims(x, [1, 3]),
        "aten::any": lambda x, y, d: aten.any(x),
        "aten::any.dim": lambda x, y, d: aten.any.dim(x, 1),
        "aten::any.dims": lambda x, y, d: aten.any.dims(x, [1, 3]),
        "aten::amax": lambda x, y, d: aten.amax(x, [1, 3]),
        "aten::amin": lambda x, y, d: aten.amin(x, [2]),
        "aten::argmax": lambda x, y, d: aten.argmax(d, 2),
        "aten::argmin": lambda x, y, d: aten.argmin(d, 1, True),
        "aten::max": lambda x, y, d: aten.max(x),
        "aten::max.dim": lambda x, y, d: tuple(aten.max.dim(d, 2)),
        "aten::min": lambda x, y, d: aten.min(x),
        "aten::min.dim": lambda x, y, d: tuple(aten.min.dim(d, 1, True)),
        "aten::mean": lambda x, y, d: aten.mean(x),
        "aten::mean.dim": lambda x, y, d: aten.mean.dim(x, [3]),
        "aten::prod": lambda x, y, d: aten.prod(y[0, 0]),
        "aten::prod.dim_int": lambda x, y, d: aten.prod.dim_int(x, 3),
        "aten::sum": lambda x, y, d: aten.sum(x),
        "aten::sum.dim_IntList": lambda x, y, d: aten.sum.dim_IntList(x, [1, 2]),
        "aten::var.correction": lambda x, y, d: aten.var.correction(x, [3], correction=1),
        "aten::var.dim": lambda x, y, d: aten.var.dim(x, [2], False),
        "aten::cumsum": lambda x, y, d: aten.cumsum(x, 3),
        "aten::sort": lambda x, y, d: tuple(aten.sort(d, 2, True)),
        "aten::topk": lambda x, y, d: tuple(aten.topk(d, 3, 2)),
        "aten::bucketize.Tensor": lambda x, y, d: aten.bucketize.Tensor(x, aten.arange.start_step(-2, 3, dtype=x.dtype)),
    }


def _creation():
    return {
        "aten::arange.start_step": lambda x, y, d: aten.arange.start_step(1, 9, 2, dtype=x.dtype) + x[0, 0, 0, :4],
        "aten::full": lambda x, y, d: aten.full([2, 3], 1, dtype=x.dtype) + x[0, :, 0, :2].T,
        "aten::full_like": lambda x, y, d: aten.full_like(x, 1),
        "aten::scalar_tensor": lambda x, y, d: aten.scalar_tensor(1, dtype=x.dtype) + x,
        "aten::fill.Scalar": lambda x, y, d: aten.fill.Scalar(x, 1),
    }


def _matmul():
    return {
        "aten::addmm": lambda x, y, d: aten.addmm(x[0, 0, :, 0], x[0, 0], y[0, 0].T),
        "aten::bmm": lambda x, y, d: aten.bmm(x[0], y[0].transpose(1, 2)),
        "aten::matmul": lambda x, y, d: aten.matmul(x, y.transpose(2, 3)),
        "aten::mm": lambda x, y, d: aten.mm(x[0, 0], y[0, 0].T),
    }


def _convolution(dtype):
    weight = torch.randn(4, 3, 3, 2).to(dtype)
    grouped = torch.randn(3, 2, 2, 3).to(dtype)
    return {
        "aten::convolution": lambda x, y, d: (
            aten.convolution(x, weight, None, [1, 1], [1, 0], [1, 1], False, [0, 0], 1),
            aten.convolution(x, grouped, None, [2, 1], [0, 1], [1, 1], True, [1, 0], 3),
        ),
        "aten::avg_pool1d": lambda x, y, d: aten.avg_pool1d(x[0], [2]),
        "aten::avg_pool2d": lambda x, y, d: aten.avg_pool2d(x, [2, 2], [1, 2], [1, 0], False, False),
        "aten::avg_pool3d": lambda x, y, d: aten.avg_pool3d(x, [2, 2, 2]),
        "aten::max_pool1d_with_indices": lambda x, y, d: aten.max_pool1d_with_indices(x[0], [2])[0],
        "aten::max_pool2d_with_indices": lambda x, y, d: aten.max_pool2d_with_indices(x, [2, 3], [1, 2])[0],
        "aten::max_pool3d_with_indices": lambda x, y, d: aten.max_pool3d_with_indices(x, [2, 2, 2])[0],
        "aten::_adaptive_avg_pool2d": lambda x, y, d: aten._adaptive_avg_pool2d(x, [2, 1]),
        "aten::_adaptive_avg_pool3d": lambda x, y, d: aten._adaptive_avg_pool3d(x, [1, 2, 1]),
        "aten::col2im": lambda x, y, d: aten.col2im(x.reshape(2, 4, 15), [4, 6], [2, 2], [1, 1], [0, 0], [1, 1]),
        "aten::upsample_bilinear2d.vec": lambda x, y, d: aten.upsample_bilinear2d.vec(x, None, False, [2.0, 1.5]),
        "aten::upsample_nearest2d.vec": lambda x, y, d: aten.upsample_nearest2d.vec(x, [8, 10], None),
        # PyTorch's CPU antialiased kernels take float32 and float64 only
        "aten::_upsample_bilinear2d_aa": lambda x, y, d: aten._upsample_bilinear2d_aa(x.float(), [3, 2], False, None, None),
        "aten::_upsample_bicubic2d_aa": lambda x, y, d: aten._upsample_bicubic2d_aa(x.float(), [5, 7], True, None, None),
    }


def _normalization(dtype):
    weight, mean, variance = torch.randn(3).to(dtype), torch.randn(3).to(dtype), (torch.rand(3) + 0.5).to(dtype)
    return {
        "aten::_native_batch_norm_legit.no_stats": lambda x, y, d: aten._native_batch_norm_legit.no_stats(
            x, None, None, True, 0.1, 1e-5
        )[0],
        "aten::_native_batch_norm_legit_no_training": lambda x, y, d: aten._native_batch_norm_legit_no_training(
            x, weight, None, mean, variance, 0.1, 1e-5
        )[0],
        "aten::native_group_norm": lambda x, y, d: aten.native_group_norm(x, None, None, 2, 3, 20, 3, 1e-5)[0],
        "aten::native_layer_norm": lambda x, y, d: aten.native_layer_norm(x, [5], None, None, 1e-5)[0],
        "aten::_softmax": lambda x, y, d: aten._softmax(x, 3, False),
        "aten::_log_softmax": lambda x, y, d: aten._log_softmax(x, 2, False),
    }


def _other(dtype):
    grid = (torch.rand(2, 3, 2, 2) * 2 - 1).to(dtype)
    codes, scale, zero = _quantized(dtype)
    stacked = tuple(t.reshape(2, 4, -1) for t in (codes, scale, zero))
    int4_tensor = _int4_tensor(codes, scale, zero)
    mx_tensor, nvfp4_tensor, mxfp4_tensor = (_float_mode_tensor(s) for s in ("mxfp8", "nvfp4", "mxfp4"))
    # mlx::gather_qmm's stack (4 experts of 8 x 64, int8 values), its scales and biases in the dtype
    stack_dtype = dtype if dtype.is_floating_point else torch.float32
    experts = (torch.randint(-128, 128, (4, 8, 64), dtype=torch.int8), (torch.rand(4, 8, 2) * 0.1).to(stack_dtype),
               (torch.randn(4, 8, 2) * 0.1).to(stack_dtype))
    # a quantized KV cache's packed rows (8 of 64 values, 8 bits in groups of 32), scales and biases in the dtype
    cached = etmlx.quantize((torch.randn(8, 64) * 0.1).to(stack_dtype), 32, 8)
    return {
        "aten::_cdist_forward": lambda x, y, d: aten._cdist_forward(x[0], y[0], 2.0, None),
        "aten::_pdist_forward": lambda x, y, d: aten._pdist_forward(x[0, 0], 2.0),
        "aten::grid_sampler_2d": lambda x, y, d: aten.grid_sampler_2d(x, grid, 0, 0, False),
        "etmlx::sdpa": lambda x, y, d: etmlx.sdpa(x, y, x, None, False, 0.5),
        "etmlx::all_sum": lambda x, y, d: etmlx.all_sum(x),  # a group of one here
        "etmlx::quantized_linear": lambda x, y, d: etmlx.quantized_linear(
            torch.cat([x.reshape(2, 60)] * 2, 1)[:, :64], codes, scale, zero, None, 32, 4
        ),
        "etmlx::quantized_embedding": lambda x, y, d: etmlx.quantized_embedding(
            codes, scale, zero, _long(1, 7, 0), 32, 4
        ),
        "etmlx::quantized_stack_take": lambda x, y, d: etmlx.quantized_stack_take(
            stacked[0], stacked[1], stacked[2], _long(1, 0, 1), 32, 4
        ),
        "torchao::dequantize_affine": lambda x, y, d: torch.ops.torchao.dequantize_affine(
            codes, [1, 32], scale, zero, torch.int8, -8, 7, output_dtype=x.dtype
        ),
        "torchao::dequantize_int4_tensor": lambda x, y, d: torch.ops.torchao.dequantize_int4_tensor(
            *int4_tensor, 32, x.dtype
        ),
        "torchao::dequantize_mx": lambda x, y, d: torch.ops.torchao.dequantize_mx(
            *mx_tensor, torch.float8_e4m3fn, 32, x.dtype
        ),
        "torchao::dequantize_nvfp4": lambda x, y, d: torch.ops.torchao.dequantize_nvfp4(
            *nvfp4_tensor, 16, x.dtype
        ),
        "etmlx::dequantize_mxfp4": lambda x, y, d: torch.ops.etmlx.dequantize_mxfp4(*mxfp4_tensor, x.dtype),
        # its seed: one integer, of d's dtype where that is an integer one
        "etmlx::random_uniform": lambda x, y, d: etmlx.random_uniform(
            d.flatten()[0].to(torch.int64) if d.is_floating_point() or d.dtype == torch.bool else d.flatten()[0], [2, 3]
        ),
        # q, k, v of 2 x 3 steps x 4 heads x 5; decays and rates from y; a state of 4 heads of 5 x 5
        "etmlx::gated_delta": lambda x, y, d: etmlx.gated_delta(
            x, x, x, y[..., 0] / 3, y[..., 1] / 3, x[:, 0, :, :, None] * x[:, 0, :, None, :] / 10
        ),
        # x, dt of 2 x 3 steps x 20 channels; decays a (20, 5) below 0; b, c of 2 x 3 x 5; a state (2, 20, 5)
        "etmlx::selective_scan": lambda x, y, d: etmlx.selective_scan(
            x.reshape(2, 3, 20), y.reshape(2, 3, 20) / 4, -y.flatten()[:100].reshape(20, 5), x[:, :, 0], x[:, :, 1],
            x[:, 0].reshape(2, 4, 5).repeat(1, 5, 1) / 10
        ),
        "etmlx::quantize": lambda x, y, d: etmlx.quantize(torch.cat([x.reshape(2, 60)] * 2, 1)[:, :64], 32, 8),
        "etmlx::quantized_matmul": lambda x, y, d: etmlx.quantized_matmul(
            torch.cat([x.reshape(2, 60)] * 2, 1)[:, :64], *cached, True, 32, 8
        ),
        "mlx::gather_qmm": lambda x, y, d: torch.ops.mlx.gather_qmm(
            torch.cat([x.reshape(2, 60)] * 2, 1)[:, None, :64], *experts, _long(0, 3), group_size=32, bits=8
        ),
    }


def _float_mode_tensor(scheme: str):
    """The constants of a ``(16, 64)`` weight quantized to ``scheme`` by ExecuTorch's config."""
    from etmlx.quant.weights import quantized_copy

    weight = quantized_copy(torch.nn.Linear(64, 16), scheme)[0].weight
    return [getattr(weight, name) for name in weight.tensor_data_names]


def _int4_tensor(codes, scale, zero):
    """``_quantized``'s weight as ExecuTorch's ExportableInt4Tensor lays it out."""
    unsigned = (codes.to(torch.int16) + 8).to(torch.uint8)
    return unsigned[:, ::2] | (unsigned[:, 1::2] << 4), scale.t().contiguous(), (zero.to(scale.dtype) + 8).t().contiguous()


def samples(dtype) -> dict:
    """rule name -> ``sample(x, y, d)`` for inputs of ``dtype``; constants (weights,
    indices) are drawn here, in that dtype, from the test's seed."""
    return {**_elementwise(), **_shape(), **_indexing(), **_reduction(), **_creation(), **_matmul(),
            **_convolution(dtype), **_normalization(dtype), **_other(dtype)}
