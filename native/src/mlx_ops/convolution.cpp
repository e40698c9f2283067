// Conv and Pool on channels-last arrays (N, *spatial, C).
#include <algorithm>
#include <array>
#include <functional>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include <mlx/ops.h>
#include <mlx/utils.h>

#include "registry.h"

namespace etmlx::native {

namespace {

using Pads = std::vector<std::pair<int, int>>;

mx::array conv_transpose(const etmlx_ir::Conv& op, const mx::array& x, const mx::array& w) {
  const auto stride = ints(op.stride());
  const auto padding = ints(op.padding());
  const auto dilation = ints(op.dilation());
  auto output_padding = ints(op.output_padding());
  const size_t spatial = stride.size();
  if (output_padding.empty()) {
    output_padding.assign(spatial, 0);
  }
  if (padding.size() != spatial || dilation.size() != spatial || output_padding.size() != spatial) {
    throw std::invalid_argument("a transposed convolution needs one stride, padding, dilation and output padding "
                                "per spatial dimension");
  }
  switch (spatial) {
    case 1:
      return mx::conv_transpose1d(x, w, stride[0], padding[0], dilation[0], output_padding[0]);
    case 2:
      return mx::conv_transpose2d(x, w, {stride[0], stride[1]}, {padding[0], padding[1]}, {dilation[0], dilation[1]},
                                  {output_padding[0], output_padding[1]});
    case 3:
      return mx::conv_transpose3d(x, w, {stride[0], stride[1], stride[2]}, {padding[0], padding[1], padding[2]},
                                  {dilation[0], dilation[1], dilation[2]},
                                  {output_padding[0], output_padding[1], output_padding[2]});
    default:
      throw std::invalid_argument("transposed convolution over " + std::to_string(spatial) +
                                  " spatial dimensions; 1 to 3 are supported");
  }
}

struct ConvGeometry {
  std::vector<int> stride, padding, dilation, kernel, outputs;
};

Pads channels_last_pads(const std::vector<std::pair<int, int>>& spatial) {
  Pads pads{{0, 0}};
  pads.insert(pads.end(), spatial.begin(), spatial.end());
  pads.emplace_back(0, 0);
  return pads;
}

// The op's stride, padding and dilation, checked against the kernel of `w`, and the
// output size per spatial axis of `x` padded by `padding`.
ConvGeometry conv_geometry(const etmlx_ir::Conv& op, const mx::array& x, const mx::array& w, const std::string& kind) {
  ConvGeometry g{ints(op.stride()), ints(op.padding()), ints(op.dilation()), {}, {}};
  const size_t spatial = x.ndim() - 2;
  const auto positive = [](const std::vector<int>& v) { return std::ranges::all_of(v, [](int i) { return i >= 1; }); };
  if (g.stride.size() != spatial || g.padding.size() != spatial || g.dilation.size() != spatial ||
      !positive(g.stride) || !positive(g.dilation) || !std::ranges::all_of(g.padding, [](int p) { return p >= 0; })) {
    throw std::invalid_argument(kind + " convolution needs a positive stride and dilation and a padding of at least 0 "
                                "per spatial dimension");
  }
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t k = w.shape(static_cast<int>(i) + 1);
    const int64_t reach = x.shape(static_cast<int>(i) + 1) + 2 * int64_t{g.padding[i]} - g.dilation[i] * (k - 1) - 1;
    if (k < 1) {
      throw std::invalid_argument(kind + " convolution with an empty kernel");
    }
    if (reach < 0) {
      throw std::invalid_argument(kind + " convolution: the dilated kernel is larger than the padded input");
    }
    g.kernel.push_back(static_cast<int>(k));
    g.outputs.push_back(Env::dim(reach / g.stride[i] + 1));
  }
  return g;
}

// `x` padded by the geometry's padding, in `dtype`.
mx::array conv_padded(const mx::array& x, const ConvGeometry& g, mx::Dtype dtype) {
  std::vector<std::pair<int, int>> pads;
  for (int p : g.padding) {
    pads.emplace_back(p, p);
  }
  return mx::pad(mx::astype(x, dtype), channels_last_pads(pads), mx::array(0, dtype));
}

// (N, *outputs, *kernel, C) view of the windows of a padded channels-last input,
// each starting `stride` apart and reading every `dilation`-th element.
mx::array windows(const mx::array& padded, const std::vector<int>& outputs, const std::vector<int>& kernel,
                  const std::vector<int>& stride, const std::vector<int>& dilation) {
  const auto x = mx::contiguous(padded);
  const auto& shape = x.shape();
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  mx::Shape window_shape{shape.front()};
  mx::Strides window_strides{strides.front()};
  for (size_t i = 0; i < kernel.size(); ++i) {
    window_shape.push_back(outputs[i]);
    window_strides.push_back(strides[i + 1] * stride[i]);
  }
  for (size_t i = 0; i < kernel.size(); ++i) {
    window_shape.push_back(kernel[i]);
    window_strides.push_back(strides[i + 1] * dilation[i]);
  }
  window_shape.push_back(shape.back());
  window_strides.push_back(1);
  return mx::as_strided(x, window_shape, window_strides, 0);
}

mx::Dtype accumulation_dtype(const mx::array& x) {  // PyTorch's kernels accumulate half precision in float32
  return x.dtype() == mx::float16 || x.dtype() == mx::bfloat16 ? mx::float32 : x.dtype();
}

int product(const std::vector<int>& values) {
  return Env::dim(std::accumulate(values.begin(), values.end(), int64_t{1}, std::multiplies<>()));
}

// Groups of several channels: on MLX's CPU its convolution kernel runs those 10-50x
// slower than one batched matmul of the input's windows (grouped_matmul), and MLX
// has no grouped 3-d convolution on any device. Mirrors
// runtime_shim/mlx_ops/convolution.py.
bool is_grouped_as_matmul(const etmlx_ir::Conv& op, const mx::array& x, const mx::array& w) {
  return op.groups() > 1 && x.ndim() == w.ndim() && x.ndim() >= 3 && x.shape(-1) % op.groups() == 0 &&
         w.shape(0) % op.groups() == 0 && int64_t{w.shape(-1)} * op.groups() == x.shape(-1) &&
         (mx::default_device() == mx::Device::cpu || x.ndim() == 5);
}

// Grouped convolution as one matmul per group, batched: the padded input's windows
// (N, *outputs, *kernel, C) regrouped to (groups, N * outputs, kernel * C/groups),
// times each group's weights (groups, kernel * C/groups, O/groups).
mx::array grouped_matmul(const etmlx_ir::Conv& op, const mx::array& x, const mx::array& w) {
  const auto g = conv_geometry(op, x, w, "grouped");
  const auto wide = accumulation_dtype(x);
  const int groups = op.groups(), outputs = w.shape(0), per_group = x.shape(-1) / groups;
  const int rows = Env::dim(int64_t{x.shape(0)} * product(g.outputs)), taps = product(g.kernel);
  const int depth = Env::dim(int64_t{taps} * per_group);
  auto patches = mx::reshape(windows(conv_padded(x, g, wide), g.outputs, g.kernel, g.stride, g.dilation),
                             {rows, taps, groups, per_group});
  patches = mx::reshape(mx::transpose(patches, {2, 0, 1, 3}), {groups, rows, depth});
  const auto weights = mx::transpose(mx::reshape(mx::astype(w, wide), {groups, outputs / groups, depth}), {0, 2, 1});
  mx::Shape shape{x.shape(0)};
  shape.insert(shape.end(), g.outputs.begin(), g.outputs.end());
  shape.push_back(outputs);
  return mx::astype(mx::reshape(mx::transpose(mx::matmul(patches, weights), {1, 0, 2}), shape), x.dtype());
}

// A group per input channel, on MLX's CPU: its convolution kernel runs those
// 3-14x slower than a sum of shifted products (depthwise_taps); on a GPU MLX's
// is fast. Mirrors runtime_shim/mlx_ops/convolution.py.
bool is_depthwise_on_cpu(const etmlx_ir::Conv& op, const mx::array& x, const mx::array& w) {
  return mx::default_device() == mx::Device::cpu && op.groups() > 1 && x.ndim() == w.ndim() && x.ndim() >= 3 &&
         op.groups() == x.shape(-1) && w.shape(-1) == 1 && w.shape(0) % op.groups() == 0;
}

// Depthwise convolution as the sum over the kernel's taps of the padded input,
// shifted by the tap and strided, times the tap's weight per channel. With m
// output channels per input channel, output channel c * m + j reads input
// channel c. Half precision accumulates in float32, as PyTorch's kernels do.
// Summed channels-first and returned as a channels-last view of that sum: on
// MLX's CPU (0.32) a batch norm and activation after the convolution ran 2x
// slower when they fused into the taps' kernel or overwrote its sum in place,
// which a transposed view rules out. Mirrors runtime_shim/mlx_ops/convolution.py.
mx::array depthwise_taps(const etmlx_ir::Conv& op, const mx::array& x, const mx::array& w) {
  const auto g = conv_geometry(op, x, w, "depthwise");
  const int rank = x.ndim();
  const size_t spatial = rank - 2;
  const int channels = x.shape(-1), outputs = w.shape(0), multiplier = outputs / channels;
  const auto wide = accumulation_dtype(x);
  std::vector<int> to_channels_first{0, rank - 1};
  std::vector<int> to_channels_last{0};
  std::vector<std::pair<int, int>> pads{{0, 0}, {0, 0}};
  for (int i = 1; i < rank - 1; ++i) {
    to_channels_first.push_back(i);
    to_channels_last.push_back(i + 1);
    pads.emplace_back(g.padding[i - 1], g.padding[i - 1]);
  }
  to_channels_last.push_back(1);
  const auto padded = mx::pad(mx::transpose(mx::astype(x, wide), to_channels_first), pads, mx::array(0, wide));
  const auto& [stride, padding, dilation, kernel, sizes] = g;
  const int taps_count = product(kernel);
  const auto taps = mx::reshape(mx::astype(w, wide), {channels, multiplier, taps_count});
  mx::Shape weight_shape{channels};
  if (multiplier > 1) {
    weight_shape.push_back(multiplier);
  }
  weight_shape.insert(weight_shape.end(), spatial, 1);
  std::vector<int> offsets(spatial, 0);
  std::optional<mx::array> total;
  for (int tap = 0; tap < taps_count; ++tap) {
    mx::Shape start{0, 0}, stop{padded.shape(0), channels}, steps{1, 1};
    for (size_t i = 0; i < spatial; ++i) {
      start.push_back(offsets[i] * dilation[i]);
      stop.push_back(start.back() + stride[i] * (sizes[i] - 1) + 1);
      steps.push_back(stride[i]);
    }
    const auto window = mx::slice(padded, start, stop, steps);
    const auto weight = mx::reshape(mx::take(taps, mx::array(tap), 2), weight_shape);  // (C, [m,] 1...)
    const auto term = multiplier > 1 ? mx::multiply(mx::expand_dims(window, 2), weight) : mx::multiply(window, weight);
    total = total ? mx::add(*total, term) : term;
    for (size_t i = spatial; i-- > 0;) {  // the next tap, the last axis fastest
      if (++offsets[i] < kernel[i]) {
        break;
      }
      offsets[i] = 0;
    }
  }
  auto out = *total;
  if (multiplier > 1) {
    mx::Shape shape{out.shape(0), outputs};
    shape.insert(shape.end(), sizes.begin(), sizes.end());
    out = mx::reshape(out, shape);
  }
  return mx::transpose(mx::astype(out, x.dtype()), to_channels_last);
}

mx::array conv(const etmlx_ir::Conv& op, Env& env) {
  const auto& x = env.t(op.x());
  const auto& w = env.t(op.weight());
  if (op.transposed()) {
    return conv_transpose(op, x, w);
  }
  if (is_depthwise_on_cpu(op, x, w)) {
    return depthwise_taps(op, x, w);
  }
  if (is_grouped_as_matmul(op, x, w)) {
    return grouped_matmul(op, x, w);
  }
  const auto padding = ints(op.padding());
  const std::vector<int> input_dilation{1};
  return mx::conv_general(mx::array(x), mx::array(w), ints(op.stride()), padding, padding, ints(op.dilation()),
                          input_dilation, op.groups());
}

// Python's // for a positive divisor.
int64_t floor_divide(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// PyTorch's pooling output size, including its ceil_mode rule that the last
// window must start inside the input or the left padding.
int64_t pool_output_size(int64_t length, int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode) {
  const int64_t span = length + 2 * pad - kernel;
  int64_t out = (ceil_mode ? -floor_divide(-span, stride) : floor_divide(span, stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= length + pad) {
    --out;
  }
  return out;
}

struct PoolGeometry {
  std::vector<int> kernel, stride, padding, outputs, extra;
  mx::Shape lengths;
};

PoolGeometry pool_geometry(const etmlx_ir::Pool& op, const mx::array& x) {
  PoolGeometry g{ints(op.kernel()), ints(op.stride()), ints(op.padding()), {}, {}, {}};
  const size_t spatial = g.kernel.size();
  if (x.ndim() != spatial + 2 || g.stride.size() != spatial || g.padding.size() != spatial) {
    throw std::invalid_argument("pooling needs one kernel size, stride and padding per spatial dimension of a (N, "
                                "*spatial, C) input");
  }
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t length = x.shape(static_cast<int>(i) + 1);
    const int64_t k = g.kernel[i], s = g.stride[i], p = g.padding[i];
    if (k < 1 || s < 1 || p < 0) {
      throw std::invalid_argument("pooling kernel and stride must be positive and padding not negative");
    }
    const int64_t out = pool_output_size(length, k, s, p, op.ceil_mode());
    if (out < 1) {
      throw std::invalid_argument("pooling window of " + std::to_string(k) + " is larger than the padded input of " +
                                  std::to_string(length + 2 * p));
    }
    // A kernel past the padded input (ceil_mode's one window: EfficientNet's head
    // pools 2x2 with a 2560 kernel) reads what the padded input holds, no more.
    const int64_t kept = std::min(k, length + 2 * p);
    g.kernel[i] = Env::dim(kept);
    g.lengths.push_back(static_cast<int>(length));
    g.outputs.push_back(Env::dim(out));
    // Right padding past PyTorch's own, so the last ceil_mode window fits.
    g.extra.push_back(Env::dim(std::max<int64_t>(0, (out - 1) * s + kept - (length + 2 * p))));
  }
  return g;
}

// (N, *outputs, *kernel, C) view of the windows of x. Every window lies inside
// x: pool_geometry padded x so the last one fits.
mx::array windows(const mx::array& padded, const PoolGeometry& g) {
  return windows(padded, g.outputs, g.kernel, g.stride, std::vector<int>(g.kernel.size(), 1));
}

std::vector<int> window_axes(const PoolGeometry& g) {
  std::vector<int> axes(g.kernel.size());
  std::iota(axes.begin(), axes.end(), 1 + static_cast<int>(g.kernel.size()));
  return axes;
}

Pads spatial_pads(const PoolGeometry& g, const std::function<std::pair<int, int>(size_t)>& per_axis) {
  Pads pads;
  for (size_t i = 0; i < g.kernel.size(); ++i) {
    pads.push_back(per_axis(i));
  }
  return channels_last_pads(pads);
}

// How many elements each average window divides by, PyTorch's way: the window
// clipped to the padded input (count_include_pad) or to the real input.
mx::array divisor(const etmlx_ir::Pool& op, const PoolGeometry& g) {
  mx::Shape ones_shape{1};
  ones_shape.insert(ones_shape.end(), g.lengths.begin(), g.lengths.end());
  ones_shape.push_back(1);
  const auto ones = mx::ones(ones_shape, mx::float32);
  mx::array counted = ones;
  if (op.count_include_pad()) {
    counted = mx::pad(ones, spatial_pads(g, [&](size_t i) { return std::pair{g.padding[i], g.padding[i]}; }),
                      mx::array(1, mx::float32));
    counted = mx::pad(counted, spatial_pads(g, [&](size_t i) { return std::pair{0, g.extra[i]}; }),
                      mx::array(0, mx::float32));
  } else {
    counted = mx::pad(ones, spatial_pads(g, [&](size_t i) { return std::pair{g.padding[i], g.padding[i] + g.extra[i]}; }),
                      mx::array(0, mx::float32));
  }
  return mx::sum(windows(counted, g), window_axes(g));
}

mx::array lowest(mx::Dtype dtype) {
  if (mx::issubdtype(dtype, mx::floating)) {
    return mx::array(static_cast<float>(mx::finfo(dtype).min), dtype);
  }
  return mx::array(mx::iinfo(dtype).min, dtype);
}

mx::array pad_for_windows(const mx::array& x, const PoolGeometry& g, const mx::array& value) {
  return mx::pad(x, spatial_pads(g, [&](size_t i) { return std::pair{g.padding[i], g.padding[i] + g.extra[i]}; }),
                 value);
}

mx::array max_pool(const etmlx_ir::Pool&, const mx::array& x, const PoolGeometry& g) {
  return mx::max(windows(pad_for_windows(x, g, lowest(x.dtype())), g), window_axes(g));
}

// PyTorch accumulates half-precision averages in float32.
mx::array avg_pool(const etmlx_ir::Pool& op, const mx::array& x, const PoolGeometry& g) {
  floating_operand(x, "average pooling");
  const bool half = x.dtype() == mx::float16 || x.dtype() == mx::bfloat16;
  const auto wide = half ? mx::astype(x, mx::float32) : x;
  const auto total = mx::sum(windows(pad_for_windows(wide, g, mx::array(0, wide.dtype())), g), window_axes(g));
  if (op.divisor_override() != 0) {
    return mx::astype(mx::divide(total, mx::array(op.divisor_override(), total.dtype())), x.dtype());
  }
  return mx::astype(mx::divide(total, divisor(op, g)), x.dtype());
}

using PoolFn = mx::array (*)(const etmlx_ir::Pool&, const mx::array&, const PoolGeometry&);
constexpr std::array<std::pair<etmlx_ir::PoolOp, PoolFn>, 2> kPool = {{
    {etmlx_ir::PoolOp::Max, max_pool},
    {etmlx_ir::PoolOp::Avg, avg_pool},
}};
static_assert(covers_enum(kPool), "every PoolOp needs a handler, in enum order");

mx::array pool(const etmlx_ir::Pool& op, Env& env) {
  const auto& x = env.t(op.x());
  return kPool[static_cast<size_t>(op.op())].second(op, x, pool_geometry(op, x));
}

}  // namespace

void register_convolution(Registry& r) {
  r.tensor<etmlx_ir::Conv, conv>();
  r.tensor<etmlx_ir::Pool, pool>();
  r.operations("Pool", enum_names(kPool, etmlx_ir::EnumNamePoolOp));
}

}  // namespace etmlx::native
