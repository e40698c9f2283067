"""Convolution and pooling on channels-last arrays (N, *spatial, C)."""

import itertools
import math
from dataclasses import dataclass

import mlx.core as mx

from etmlx.serializer.generated.etmlx_ir.PoolOp import PoolOp

from .env import floating_operand


_CONV_TRANSPOSE = {1: mx.conv_transpose1d, 2: mx.conv_transpose2d, 3: mx.conv_transpose3d}


def _conv(op, env):
    if op.transposed:
        spatial = len(op.stride)

        def per_axis(values):  # conv_transpose1d takes ints, 2d/3d tuples
            return values[0] if spatial == 1 else tuple(values)

        return _CONV_TRANSPOSE[spatial](
            env.t(op.x),
            env.t(op.weight),
            stride=per_axis(op.stride),
            padding=per_axis(op.padding),
            dilation=per_axis(op.dilation),
            output_padding=per_axis(op.outputPadding or [0] * spatial),
        )
    x, w = env.t(op.x), env.t(op.weight)
    if _is_depthwise_on_cpu(op, x, w):
        return _depthwise_taps(x, w, list(op.stride), list(op.padding), list(op.dilation))
    if _is_grouped_as_matmul(op, x, w):
        return _grouped_matmul(x, w, op.groups, list(op.stride), list(op.padding), list(op.dilation))
    return mx.conv_general(
        x, w, stride=list(op.stride), padding=list(op.padding), kernel_dilation=list(op.dilation), groups=op.groups
    )


def _is_depthwise_on_cpu(op, x: mx.array, w: mx.array) -> bool:
    """A group per input channel, on MLX's CPU: its convolution kernel runs those 3-14x
    slower than a sum of shifted products (``_depthwise_taps``); on a GPU MLX's is fast."""
    return (
        mx.default_device() == mx.cpu and op.groups > 1 and op.groups == x.shape[-1] and w.shape[-1] == 1
        and w.shape[0] % op.groups == 0 and x.ndim == w.ndim
    )


def _is_grouped_as_matmul(op, x: mx.array, w: mx.array) -> bool:
    """Groups of several channels: on MLX's CPU its convolution kernel runs those 10-50x
    slower than one batched matmul of the input's windows (``_grouped_matmul``: RegNet's
    3x3 groups of 8 channels at 28x28x104, 35 ms -> 2.6 ms), and MLX has no grouped 3-d
    convolution on any device."""
    return (
        op.groups > 1 and x.ndim == w.ndim and x.ndim >= 3 and x.shape[-1] % op.groups == 0
        and w.shape[0] % op.groups == 0 and w.shape[-1] * op.groups == x.shape[-1]
        and (mx.default_device() == mx.cpu or x.ndim == 5)
    )


def _checked_geometry(kind: str, kernel, stride: list, padding: list, dilation: list) -> None:
    if not len(stride) == len(padding) == len(dilation) == len(kernel) or min(stride + dilation + list(kernel)) < 1 \
            or min(padding) < 0:
        raise ValueError(f"{kind} convolution with kernel {list(kernel)}, stride {stride}, padding {padding}, "
                         f"dilation {dilation}")


def _output_sizes(kind: str, lengths, kernel, stride: list, dilation: list) -> list:
    """Outputs per spatial axis of a padded input of ``lengths``."""
    sizes = [(n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(lengths, kernel, stride, dilation)]
    if min(sizes) < 1:
        raise ValueError(f"{kind} convolution: a kernel of {list(kernel)} (dilation {dilation}) is larger than "
                         f"the padded input {list(lengths)}")
    return sizes


def _windows(padded: mx.array, outputs: list, kernel: list, stride: list, dilation: list) -> mx.array:
    """(N, *outputs, *kernel, C) view of the windows of a padded channels-last input,
    each starting ``stride`` apart and reading every ``dilation``-th element."""
    x = mx.contiguous(padded)
    shape = x.shape
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    spatial = range(1, len(shape) - 1)
    window_shape = [shape[0], *outputs, *kernel, shape[-1]]
    window_strides = [
        strides[0],
        *(strides[i] * s for i, s in zip(spatial, stride)),
        *(strides[i] * d for i, d in zip(spatial, dilation)),
        1,
    ]
    return mx.as_strided(x, window_shape, window_strides)


def _grouped_matmul(x: mx.array, w: mx.array, groups: int, stride: list, padding: list, dilation: list) -> mx.array:
    """Grouped convolution as one matmul per group, batched: the padded input's windows
    (N, *outputs, *kernel, C) regrouped to (groups, N * outputs, kernel * C/groups), times
    each group's weights (groups, kernel * C/groups, O/groups). Half precision computes in
    float32, as PyTorch's kernels accumulate."""
    kernel, outputs = list(w.shape[1:-1]), w.shape[0]
    _checked_geometry("grouped", kernel, stride, padding, dilation)
    wide = mx.float32 if x.dtype in (mx.float16, mx.bfloat16) else x.dtype
    padded = mx.pad(x.astype(wide), [(0, 0)] + [(p, p) for p in padding] + [(0, 0)])
    sizes = _output_sizes("grouped", padded.shape[1:-1], kernel, stride, dilation)
    rows, taps, per_group = x.shape[0] * math.prod(sizes), math.prod(kernel), x.shape[-1] // groups
    patches = _windows(padded, sizes, kernel, stride, dilation).reshape(rows, taps, groups, per_group)
    patches = patches.transpose(2, 0, 1, 3).reshape(groups, rows, taps * per_group)
    weights = w.astype(wide).reshape(groups, outputs // groups, taps * per_group).transpose(0, 2, 1)
    out = (patches @ weights).transpose(1, 0, 2).reshape(x.shape[0], *sizes, outputs)
    return out.astype(x.dtype)


def _depthwise_taps(x: mx.array, w: mx.array, stride: list, padding: list, dilation: list) -> mx.array:
    """Depthwise convolution as the sum over the kernel's taps of the padded input,
    shifted by the tap and strided, times the tap's weight per channel. With m output
    channels per input channel, output channel c * m + j reads input channel c. Half
    precision accumulates in float32, as PyTorch's kernels do.

    Summed channels-first and returned as a channels-last view of that sum: on MLX's CPU
    (0.32) a batch norm and activation after the convolution ran 2x slower when they fused
    into the taps' kernel or overwrote its sum in place (MobileNetV2's 3x3 over 56x56x144
    with its batch norm and ReLU6: 7.1 ms against 3.5), and a transposed view allows
    neither."""
    channels, outputs = x.shape[-1], w.shape[0]
    multiplier, kernel = outputs // channels, w.shape[1:-1]
    wide = mx.float32 if x.dtype in (mx.float16, mx.bfloat16) else x.dtype
    _checked_geometry("depthwise", kernel, stride, padding, dilation)
    spatial = x.ndim - 2
    padded = mx.pad(x.astype(wide).transpose(0, x.ndim - 1, *range(1, x.ndim - 1)),
                    [(0, 0), (0, 0)] + [(p, p) for p in padding])
    sizes = _output_sizes("depthwise", padded.shape[2:], kernel, stride, dilation)
    taps = w.astype(wide).reshape(channels, multiplier, -1)  # (C, m, taps)
    ones = (1,) * spatial
    total = None
    for tap, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        window = padded[(slice(None), slice(None)) + tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s) for o, d, s, n in zip(offsets, dilation, stride, sizes)
        )]
        if multiplier > 1:
            term = window[:, :, None] * taps[:, :, tap].reshape(channels, multiplier, *ones)
        else:
            term = window * taps[:, 0, tap].reshape(channels, *ones)
        total = term if total is None else total + term
    if multiplier > 1:
        total = total.reshape(total.shape[0], outputs, *sizes)
    return total.astype(x.dtype).transpose(0, *range(2, x.ndim), 1)


def _output_size(length: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size, including its ceil_mode rule that the last
    window must start inside the input or the left padding."""
    span = length + 2 * pad - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= length + pad:
        out -= 1
    return out


@dataclass(frozen=True)
class _Geometry:
    """Where a pooling node's windows lie on a channels-last input."""

    kernel: list
    stride: list
    padding: list
    lengths: list  # the spatial sizes of the input
    outputs: list  # windows per spatial axis
    extra: list  # right padding past PyTorch's own, so the last ceil_mode window fits

    @classmethod
    def of(cls, op, x: mx.array) -> "_Geometry":
        kernel, stride, padding = list(op.kernel), list(op.stride), list(op.padding)
        lengths = list(x.shape[1:-1])
        outputs = [_output_size(n, k, s, p, op.ceilMode) for n, k, s, p in zip(lengths, kernel, stride, padding)]
        # A kernel past the padded input (ceil_mode's one window: EfficientNet's head pools
        # 2x2 with a 2560 kernel) reads what the padded input holds, no more.
        kernel = [min(k, n + 2 * p) for k, n, p in zip(kernel, lengths, padding)]
        extra = [max(0, (o - 1) * s + k - (n + 2 * p)) for o, s, k, n, p in zip(outputs, stride, kernel, lengths, padding)]
        return cls(kernel, stride, padding, lengths, outputs, extra)

    @property
    def axes(self) -> tuple:
        """The window axes of ``windows(...)``."""
        return tuple(range(1 + len(self.kernel), 1 + 2 * len(self.kernel)))

    def pads(self, per_axis) -> list:
        """Channels-last pad widths, ``per_axis(i)`` for each spatial axis."""
        return [(0, 0)] + [per_axis(i) for i in range(len(self.kernel))] + [(0, 0)]

    def windows(self, padded: mx.array) -> mx.array:
        """(N, *outputs, *kernel, C) view of the windows of a padded input."""
        return _windows(padded, self.outputs, self.kernel, self.stride, [1] * len(self.kernel))


def _pool(op, env):
    x = env.t(op.x)
    return POOL[op.op](op, x, _Geometry.of(op, x))


def _max_pool(op, x: mx.array, g: _Geometry) -> mx.array:
    low = mx.finfo(x.dtype).min if mx.issubdtype(x.dtype, mx.floating) else mx.iinfo(x.dtype).min
    padded = mx.pad(x, g.pads(lambda i: (g.padding[i], g.padding[i] + g.extra[i])), constant_values=low)
    return mx.max(g.windows(padded), axis=g.axes)


def _avg_pool(op, x: mx.array, g: _Geometry) -> mx.array:
    floating_operand(x, "average pooling")
    wide = x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x  # PyTorch accumulates in float32
    padded = mx.pad(wide, g.pads(lambda i: (g.padding[i], g.padding[i] + g.extra[i])))
    total = mx.sum(g.windows(padded), axis=g.axes)
    if op.divisorOverride:
        return (total / op.divisorOverride).astype(x.dtype)
    return (total / _divisor(op, g)).astype(x.dtype)


def _divisor(op, g: _Geometry) -> mx.array:
    """How many elements each average window divides by, PyTorch's way: the window
    clipped to the padded input (count_include_pad) or to the real input."""
    ones = mx.ones((1, *g.lengths, 1), dtype=mx.float32)
    if op.countIncludePad:
        counted = mx.pad(ones, g.pads(lambda i: (g.padding[i], g.padding[i])), constant_values=1)
        counted = mx.pad(counted, g.pads(lambda i: (0, g.extra[i])))
    else:
        counted = mx.pad(ones, g.pads(lambda i: (g.padding[i], g.padding[i] + g.extra[i])))
    return mx.sum(g.windows(counted), axis=g.axes)


POOL = {PoolOp.Max: _max_pool, PoolOp.Avg: _avg_pool}


HANDLERS = {"Conv": _conv, "Pool": _pool}
