// Quantized kernels: QuantizedMatmul (a linear layer's weight, or a quantized KV cache's
// keys and values), Dequantize (rows gathered from a quantized embedding) and GatherQmm
// (quantized experts), in MLX's affine mode or one of its float modes (mxfp4, mxfp8,
// nvfp4: no biases); Quantize (keys and values written to a quantized KV cache). MLX
// checks that the packed weights, scales and biases agree in shape and dtype; the
// parameters are checked here.
#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <mlx/ops.h>

#include "constants.h"
#include "experts.h"
#include "products.h"
#include "registry.h"

namespace etmlx::native {

namespace {

// MLX's names of the QuantMode values (the validator has checked the value is one).
constexpr std::array<const char*, 4> kModeNames = {"affine", "mxfp4", "mxfp8", "nvfp4"};

struct Quantization {
  int group_size;
  int bits;
  std::string mode;
};

std::string list(const auto& values) {
  std::string text;
  for (int v : values) {
    text += (text.empty() ? "" : ", ") + std::to_string(v);
  }
  return text;
}

Quantization checked(int group_size, int bits, etmlx_ir::QuantMode mode, bool has_biases) {
  const auto index = static_cast<size_t>(mode);
  if (index >= kModeNames.size()) {
    throw std::invalid_argument("quantization mode " + std::to_string(index) + " (etmlx writes 0 to 3)");
  }
  if (mode != etmlx_ir::QuantMode::Affine) {
    const int expected_bits = kQuantizedFloatBits[index - 1];
    const int expected_group = kQuantizedFloatGroupSizes[index - 1];
    if (bits != expected_bits || group_size != expected_group || has_biases) {
      throw std::invalid_argument(std::string(kModeNames[index]) + " weights of " + std::to_string(bits) +
                                  " bits in groups of " + std::to_string(group_size) +
                                  (has_biases ? " with biases" : "") + " (" + kModeNames[index] + " is " +
                                  std::to_string(expected_bits) + " bits in groups of " +
                                  std::to_string(expected_group) + ", without biases)");
    }
  } else if (std::ranges::find(kQuantizedBits, bits) == kQuantizedBits.end() ||
             std::ranges::find(kQuantizedGroupSizes, group_size) == kQuantizedGroupSizes.end() || !has_biases) {
    throw std::invalid_argument("quantized weights of " + std::to_string(bits) + " bits in groups of " +
                                std::to_string(group_size) + " (etmlx writes bits " + list(kQuantizedBits) +
                                " and groups of " + list(kQuantizedGroupSizes) + ", with biases)");
  }
  return {group_size, bits, kModeNames[index]};
}

template <class Table>
std::optional<mx::array> biases(const Table& op, Env& env) {
  return env.t_if(op.has_biases(), op.biases());
}

// Packed words as MLX's kernels take them: uint32 (a KV cache holds them as int32).
mx::array words(const mx::array& w) { return w.dtype() == mx::int32 ? mx::view(w, mx::uint32) : w; }

// MLX's CPU quantized matmul is a scalar loop per row of x; from this many rows on (a
// prefill chunk, attention over a quantized cache), dequantizing the weights and
// multiplying with BLAS is faster (docs/architecture.md, "MLX traps").
constexpr int kCpuDequantizedRows = 4;

// The weights are dequantized a block of rows of about this many values at a time: MLX's
// CPU dequantize holds five times its output while it runs, and its scheduler runs a
// dequantize (which reads only constants) long before the product that needs it, so whole
// weights held ~400 MiB at once in a 1B model's prefill. Each block waits for the product
// of the block before it (the first for x): a few blocks are held at a time.
constexpr int64_t kCpuDequantizedBlockValues = int64_t{1} << 20;
// Blocks are whole multiples of this many rows: at a prefill's sizes OpenBLAS then rounds
// every element of the product as for the whole weight, where blocks of 1 or 33 rows
// moved last bits (its small-matrix kernels, as over a cache's 64-wide heads, still may).
constexpr int kCpuDequantizedBlockRows = 64;

// Whether MLX's dequantize would take these operands (a broadcast would not).
bool in_mlx_layout(const mx::array& w, const mx::array& scales, const std::optional<mx::array>& bias,
                   const Quantization& q) {
  const auto leading = [](const mx::array& a) { return mx::Shape(a.shape().begin(), a.shape().end() - 1); };
  return bias && w.dtype() == mx::uint32 && w.ndim() >= 2 && scales.ndim() == w.ndim() && bias->ndim() == w.ndim() &&
         scales.dtype() == bias->dtype() && mx::issubdtype(scales.dtype(), mx::floating) &&
         leading(w) == leading(scales) && leading(w) == leading(*bias) &&
         int64_t{w.shape(-1)} * 32 == int64_t{scales.shape(-1)} * q.group_size * q.bits;
}

// MLX's affine dequantize of 2, 4 or 8 bits, bit for bit, from the words' bytes: its CPU
// form (shifts of the uint32 words, a concatenate, the affine step) makes 20 arrays and
// 8x the output's bytes on the way at 4 bits; this one 4 arrays and 3x, in half the
// time. Each byte holds 8 / bits values, the lowest first (MLX packs words little-endian,
// as the byte order of every machine MLX runs on). Other widths, the float modes and
// operands MLX would refuse (it says why): MLX's own (runtime_shim/mlx_ops/quantized.py:
// _cpu_dequantize).
mx::array cpu_dequantize(const mx::array& w, const mx::array& scales, const std::optional<mx::array>& bias,
                         const Quantization& q, mx::Dtype dtype) {
  if (q.mode != "affine" || (q.bits != 2 && q.bits != 4 && q.bits != 8) || !in_mlx_layout(w, scales, bias, q)) {
    return mx::dequantize(w, scales, bias, q.group_size, q.bits, q.mode, std::nullopt, dtype);
  }
  mx::array values = mx::view(w, mx::uint8);
  if (q.bits < 8) {
    const mx::array mask(static_cast<uint8_t>((1 << q.bits) - 1));
    std::vector<mx::array> parts;
    for (int shift = 0; shift < 8; shift += q.bits) {
      parts.push_back(mx::bitwise_and(mx::right_shift(values, mx::array(static_cast<uint8_t>(shift))), mask));
    }
    values = mx::stack(parts, -1);
  }
  mx::Shape grouped(w.shape().begin(), w.shape().end() - 1);
  grouped.push_back(-1);
  grouped.push_back(q.group_size);
  const mx::array dense = mx::add(mx::multiply(mx::reshape(values, grouped), mx::expand_dims(scales, -1)),
                                  mx::expand_dims(*bias, -1));
  mx::Shape flat(w.shape().begin(), w.shape().end() - 1);
  flat.push_back(-1);
  return mx::astype(mx::reshape(dense, flat), dtype);
}

// x @ dequantized(w).T on the CPU, w dequantized a block of rows at a time.
mx::array dequantized_by_blocks(const mx::array& x, const mx::array& w, const mx::array& scales,
                                const std::optional<mx::array>& bias, const Quantization& q) {
  const auto dense = [&](const mx::array& words, const mx::array& block_scales,
                         const std::optional<mx::array>& block_biases) {
    return cpu_dequantize(words, block_scales, block_biases, q, x.dtype());
  };
  const int rows = w.shape(-2);
  int64_t values_per_row = int64_t{scales.shape(-1)} * q.group_size;
  for (size_t axis = 0; axis + 2 < w.ndim(); ++axis) {
    values_per_row *= w.shape(static_cast<int>(axis));
  }
  int64_t step = kCpuDequantizedBlockValues / std::max<int64_t>(1, values_per_row);
  step = std::max<int64_t>(kCpuDequantizedBlockRows, step - step % kCpuDequantizedBlockRows);
  if (rows <= step) {
    return product(x, mx::swapaxes(dense(w, scales, bias), -1, -2));
  }
  const auto rows_of = [](const mx::array& a, int start, int stop) {
    mx::Shape begin(a.ndim(), 0);
    mx::Shape end = a.shape();
    begin[a.ndim() - 2] = start;
    end[a.ndim() - 2] = stop;
    return mx::slice(a, begin, end);
  };
  std::vector<mx::array> products;
  for (int start = 0; start < rows; start += static_cast<int>(step)) {
    const int stop = static_cast<int>(std::min<int64_t>(rows, start + step));
    const std::optional<mx::array> block_biases =
        bias ? std::optional<mx::array>(rows_of(*bias, start, stop)) : std::nullopt;
    const mx::array block = dense(rows_of(w, start, stop), rows_of(scales, start, stop), block_biases);
    const mx::array waited = mx::depends({block}, {products.empty() ? x : products.back()})[0];
    products.push_back(product(x, mx::swapaxes(waited, -1, -2)));
  }
  return mx::concatenate(products, -1);
}

mx::array quantized_matmul(const etmlx_ir::QuantizedMatmul& op, Env& env) {
  const auto [group_size, bits, mode] = checked(op.group_size(), op.bits(), op.mode(), op.has_biases());
  const mx::array& x = env.t(op.x());
  const mx::array w = words(env.t(op.w()));
  mx::array scales = env.t(op.scales());
  std::optional<mx::array> bias = biases(op, env);
  if (mx::default_device() == mx::Device::cpu && x.ndim() >= 2 && x.shape(-2) >= kCpuDequantizedRows) {
    if (op.mode() == etmlx_ir::QuantMode::Affine) {  // float16 scales of float32 weights (GGUF's): widened first
      scales = mx::astype(scales, x.dtype());
      bias = mx::astype(*bias, x.dtype());
    }
    if (!op.transpose()) {  // blocks of rows would split the sums
      return product(x, cpu_dequantize(w, scales, bias, {group_size, bits, mode}, x.dtype()));
    }
    return dequantized_by_blocks(x, w, scales, bias, {group_size, bits, mode});
  }
  if (half_on_cpu(x)) {
    // the kernel in half precision: 7.6x its float32 time (a row of 2048 by 11008: 157 ms
    // against 21), so in float32, rounded back once (a decode step of a bfloat16 export)
    if (op.mode() == etmlx_ir::QuantMode::Affine) {
      scales = mx::astype(scales, mx::float32);
      bias = mx::astype(*bias, mx::float32);
    }
    const mx::array wide = mx::quantized_matmul(mx::astype(x, mx::float32), w, scales, bias, op.transpose(),
                                                group_size, bits, mode);
    return mx::astype(wide, x.dtype());
  }
  return mx::quantized_matmul(x, w, scales, bias, op.transpose(), group_size, bits, mode);
}

mx::array quantize(const etmlx_ir::Quantize& op, Env& env) {
  if (std::ranges::find(kQuantizedCacheBits, op.bits()) == kQuantizedCacheBits.end() ||
      std::ranges::find(kQuantizedGroupSizes, op.group_size()) == kQuantizedGroupSizes.end()) {
    throw std::invalid_argument("a KV cache quantized to " + std::to_string(op.bits()) + " bits in groups of " +
                                std::to_string(op.group_size()) + " (etmlx writes bits " + list(kQuantizedCacheBits) +
                                " and groups of " + list(kQuantizedGroupSizes) + ")");
  }
  const auto part = static_cast<size_t>(op.part());
  if (part > static_cast<size_t>(etmlx_ir::QuantizedPart::MAX)) {
    throw std::invalid_argument("quantized part " + std::to_string(part) + " (etmlx writes 0 to 2)");
  }
  std::vector<mx::array> parts = mx::quantize(env.t(op.x()), op.group_size(), op.bits());
  return part == 0 ? mx::view(parts[0], mx::int32) : parts[part];
}

mx::array dequantize(const etmlx_ir::Dequantize& op, Env& env) {
  const auto [group_size, bits, mode] = checked(op.group_size(), op.bits(), op.mode(), op.has_biases());
  // The float modes' values are exact in float32 (MLX's default would be bfloat16).
  const std::optional<mx::Dtype> dtype =
      op.mode() == etmlx_ir::QuantMode::Affine ? std::nullopt : std::optional<mx::Dtype>(mx::float32);
  return mx::dequantize(env.t(op.w()), env.t(op.scales()), biases(op, env), group_size, bits, mode, std::nullopt,
                        dtype);
}

mx::array gather_qmm(const etmlx_ir::GatherQmm& op, Env& env) {
  const auto [group_size, bits, mode] = checked(op.group_size(), op.bits(), etmlx_ir::QuantMode::Affine, true);
  const mx::array& w = env.t(op.w());
  if (w.ndim() != 3) {
    throw std::invalid_argument("gather_qmm over packed weights of " + std::to_string(w.ndim()) +
                                " dimensions: expected (experts, N, K packed)");
  }
  const mx::array safe = clamped_expert_indices(env.t(op.rhs_indices()), w.shape(0), "gather_qmm");
  return mx::gather_qmm(env.t(op.x()), w, env.t(op.scales()), env.t(op.biases()), std::nullopt, safe,
                        op.transpose(), group_size, bits, mode);
}

}  // namespace

void register_quantized(Registry& r) {
  r.tensor<etmlx_ir::QuantizedMatmul, quantized_matmul>();
  r.tensor<etmlx_ir::Dequantize, dequantize>();
  r.tensor<etmlx_ir::GatherQmm, gather_qmm>();
  r.tensor<etmlx_ir::Quantize, quantize>();
}

}  // namespace etmlx::native
