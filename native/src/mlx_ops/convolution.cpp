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
mx::array depthwise_taps(const etmlx_ir::Conv& op, const mx::array& x, const mx::array& w) {
  const auto stride = ints(op.stride());
  const auto padding = ints(op.padding());
  const auto dilation = ints(op.dilation());
  const size_t spatial = x.ndim() - 2;
  const auto positive = [](const std::vector<int>& v) { return std::ranges::all_of(v, [](int i) { return i >= 1; }); };
  if (stride.size() != spatial || padding.size() != spatial || dilation.size() != spatial || !positive(stride) ||
      !positive(dilation) || !std::ranges::all_of(padding, [](int p) { return p >= 0; })) {
    throw std::invalid_argument("depthwise convolution needs a positive stride and dilation and a padding of at least 0 "
                                "per spatial dimension");
  }
  const int channels = x.shape(-1), outputs = w.shape(0), multiplier = outputs / channels;
  const bool half = x.dtype() == mx::float16 || x.dtype() == mx::bfloat16;
  const auto wide = half ? mx::float32 : x.dtype();
  Pads pads{{0, 0}};
  for (int p : padding) {
    pads.emplace_back(p, p);
  }
  pads.emplace_back(0, 0);
  const auto padded = mx::pad(mx::astype(x, wide), pads, mx::array(0, wide));
  std::vector<int> sizes, kernel;
  int taps_count = 1;
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t k = w.shape(static_cast<int>(i) + 1), n = padded.shape(static_cast<int>(i) + 1);
    if (k < 1) {
      throw std::invalid_argument("depthwise convolution with an empty kernel");
    }
    const int64_t size = (n - int64_t{dilation[i]} * (k - 1) - 1) / stride[i] + 1;
    if (n - int64_t{dilation[i]} * (k - 1) - 1 < 0 || size < 1) {
      throw std::invalid_argument("depthwise convolution: the dilated kernel is larger than the padded input");
    }
    sizes.push_back(static_cast<int>(size));
    kernel.push_back(static_cast<int>(k));
    taps_count *= static_cast<int>(k);
  }
  const auto taps = mx::reshape(mx::astype(w, wide), {channels, multiplier, taps_count});
  std::vector<int> offsets(spatial, 0);
  std::optional<mx::array> total;
  for (int tap = 0; tap < taps_count; ++tap) {
    mx::Shape start{0}, stop{padded.shape(0)}, steps{1};
    for (size_t i = 0; i < spatial; ++i) {
      start.push_back(offsets[i] * dilation[i]);
      stop.push_back(start.back() + stride[i] * (sizes[i] - 1) + 1);
      steps.push_back(stride[i]);
    }
    start.push_back(0);
    stop.push_back(channels);
    steps.push_back(1);
    const auto window = mx::slice(padded, start, stop, steps);
    const auto weight = mx::take(taps, mx::array(tap), 2);  // (C, m)
    const auto term = multiplier > 1 ? mx::multiply(mx::expand_dims(window, -1), weight)
                                     : mx::multiply(window, mx::squeeze(weight, 1));
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
    auto shape = out.shape();
    shape.pop_back();
    shape.back() = outputs;
    out = mx::reshape(out, shape);
  }
  return mx::astype(out, x.dtype());
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
mx::array windows(const mx::array& input, const PoolGeometry& g) {
  const auto x = mx::contiguous(input);
  const auto& shape = x.shape();
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  mx::Shape window_shape{shape.front()};
  mx::Strides window_strides{strides.front()};
  for (size_t i = 0; i < g.kernel.size(); ++i) {
    window_shape.push_back(g.outputs[i]);
    window_strides.push_back(strides[i + 1] * g.stride[i]);
  }
  for (size_t i = 0; i < g.kernel.size(); ++i) {
    window_shape.push_back(g.kernel[i]);
    window_strides.push_back(strides[i + 1]);
  }
  window_shape.push_back(shape.back());
  window_strides.push_back(1);
  return mx::as_strided(x, window_shape, window_strides, 0);
}

std::vector<int> window_axes(const PoolGeometry& g) {
  std::vector<int> axes(g.kernel.size());
  std::iota(axes.begin(), axes.end(), 1 + static_cast<int>(g.kernel.size()));
  return axes;
}

Pads channels_last_pads(const std::vector<std::pair<int, int>>& spatial) {
  Pads pads{{0, 0}};
  pads.insert(pads.end(), spatial.begin(), spatial.end());
  pads.emplace_back(0, 0);
  return pads;
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
