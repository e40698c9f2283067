#include "cpu_math.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <span>
#include <utility>
#include <vector>

#include <mlx/fast.h>
#include <mlx/linalg.h>
#include <mlx/ops.h>

#include "constants.h"
#include "scalars.h"

namespace etmlx::native::cpu_math {

namespace {

// Horner's rule, coefficients from the lowest power up.
mx::array polynomial(std::span<const double> coefficients, const mx::array& x) {
  auto total = float_scalar(coefficients.back(), x.dtype());
  for (auto c = coefficients.rbegin() + 1; c != coefficients.rend(); ++c) {
    total = mx::add(mx::multiply(total, x), mx::array(static_cast<float>(*c)));
  }
  return total;
}

mx::array scalar(double value) { return mx::array(static_cast<float>(value)); }

// Estrin's scheme, coefficients from the lowest power up (two or more): pairs c + c' x,
// then pairs of those with x^2, x^4, ...: 2 log2(n) operations deep where Horner's rule
// is 2n, so that a polynomial fits in one fused kernel.
mx::array estrin(std::span<const double> coefficients, const mx::array& x) {
  std::vector<mx::array> terms;
  for (const double c : coefficients) {
    terms.push_back(scalar(c));
  }
  auto power = x;
  while (true) {
    std::vector<mx::array> pairs;
    for (size_t i = 0; i + 1 < terms.size(); i += 2) {
      pairs.push_back(mx::add(terms[i], mx::multiply(power, terms[i + 1])));
    }
    if (terms.size() % 2 == 1) {
      pairs.push_back(terms.back());
    }
    terms = std::move(pairs);
    if (terms.size() == 1) {
      return terms.front();
    }
    power = mx::multiply(power, power);
  }
}

// x through a bitcast and back: the same bits, as the root of its own fused kernel.
mx::array kernel_end(const mx::array& x) { return mx::view(mx::view(x, mx::uint32), mx::float32); }

// e^r to 5e-9 for |r| <= ln(2) / 2: Taylor's coefficients, the lowest power first.
constexpr std::array<double, 8> kExpTaylor = [] {
  std::array<double, 8> coefficients{};
  double factorial = 1;
  for (size_t n = 0; n < coefficients.size(); ++n) {
    factorial *= n > 0 ? static_cast<double>(n) : 1.0;
    coefficients[n] = 1 / factorial;
  }
  return coefficients;
}();

mx::array exponent_bits(const mx::array& k) {
  return mx::view(mx::left_shift(mx::add(mx::astype(k, mx::int32), mx::array(127)), mx::array(23)), mx::float32);
}

// value * 2^k for integral float32 k in [-126, 128], in two halves.
mx::array times_power_of_two(const mx::array& value, const mx::array& k) {
  const auto half = mx::floor(mx::multiply(k, scalar(0.5)));
  return mx::multiply(mx::multiply(value, exponent_bits(half)), exponent_bits(mx::subtract(k, half)));
}

// e^t for float32 t <= 0 (or -inf, or NaN, which stays NaN), to 0 from where it rounds
// to 0: k rounded by kRoundToInteger, e^r by Estrin's scheme, 2^k added to e^r's exponent
// bits, lifted so that the sum stays normal, then scaled back once. All of it vectorizes
// in MLX's compiled CPU kernels (see cpu_math.py).
mx::array exp_of_nonpositive(const mx::array& exponent) {
  const auto t = mx::maximum(exponent, scalar(kExpNonpositiveLeast));
  const auto rounder = scalar(kRoundToInteger);
  const auto k = mx::subtract(mx::add(mx::multiply(t, scalar(std::numbers::log2e)), rounder), rounder);
  const auto r = mx::subtract(mx::subtract(t, mx::multiply(k, scalar(kLn2High))), mx::multiply(k, scalar(kLn2Low)));
  const auto lifted_k = mx::astype(mx::add(mx::astype(k, mx::int32), mx::array(kExpNonpositiveLift)), mx::uint32);
  const auto lift = mx::left_shift(lifted_k, mx::array(23u));  // wraps, as meant
  const auto lifted = mx::view(mx::add(mx::view(estrin(kExpTaylor, r), mx::uint32), lift), mx::float32);
  const auto value = mx::multiply(lifted, scalar(std::ldexp(1.0, -kExpNonpositiveLift)));
  return mx::add(value, mx::multiply(mx::array(0.0f), t));  // +-0, or NaN where t is (its integer bits lose it)
}

// 1 / (1 + e) for x >= 0, e / (1 + e) below, e = e^-|x|; the sign bit picks the
// numerator as 0/1 factors (cpu_math.py's sigmoid).
mx::array sigmoid_by_parts(const mx::array& x) {
  const auto wide = mx::astype(x, mx::float32);
  const auto e = exp_of_nonpositive(mx::negative(mx::abs(wide)));
  const auto sign = mx::right_shift(mx::view(wide, mx::int32), mx::array(31));
  const auto negative = mx::astype(mx::negative(sign), mx::float32);
  const auto numerator = mx::add(mx::subtract(mx::array(1.0f), negative), mx::multiply(e, negative));
  return mx::astype(mx::divide(numerator, mx::add(mx::array(1.0f), e)), x.dtype());
}

mx::array silu(const mx::array& x) { return mx::multiply(x, sigmoid_by_parts(x)); }  // mlx.nn.silu's operations

// mlx.nn.gelu's operations (mlx_nn.cpp), with this erf.
mx::array gelu(const mx::array& x) {
  const auto dtype = x.dtype();
  const auto cdf = mx::add(mx::array(1, dtype), rational_erf(mx::divide(x, float_scalar(std::sqrt(2.0), dtype))));
  return mx::divide(mx::multiply(x, cdf), mx::array(2, dtype));
}

}  // namespace

bool float32_or_narrower(const mx::array& x) {
  return x.dtype() == mx::float32 || x.dtype() == mx::float16 || x.dtype() == mx::bfloat16;
}

mx::array rational_erf(const mx::array& x) {
  const auto limit = static_cast<float>(kErfClamp);
  const auto clamped = mx::clip(mx::astype(x, mx::float32), mx::array(-limit), mx::array(limit));
  const auto square = mx::multiply(clamped, clamped);
  const auto ratio = kernel_end(mx::divide(estrin(kErfNumerator, square), estrin(kErfDenominator, square)));
  return mx::astype(kernel_end(mx::clip(mx::multiply(clamped, ratio), mx::array(-1.0f), mx::array(1.0f))), x.dtype());
}

mx::array exp_by_parts(const mx::array& x) {
  const auto wide = mx::astype(x, mx::float32);
  const auto nan = mx::isnan(wide);
  const auto reduced = mx::where(nan, mx::array(0.0f), mx::clip(wide, scalar(kExpLow), scalar(kExpHigh)));
  const auto k = mx::floor(mx::add(mx::multiply(reduced, scalar(std::numbers::log2e)), scalar(0.5)));
  const auto r = mx::subtract(mx::subtract(reduced, mx::multiply(k, scalar(kLn2High))), mx::multiply(k, scalar(kLn2Low)));
  auto value = times_power_of_two(polynomial(kExpTaylor, r), k);
  value = mx::where(mx::less(wide, scalar(kExpLow)), mx::array(0.0f),
                    mx::where(mx::greater(wide, scalar(kExpHigh)), mx::array(std::numeric_limits<float>::infinity()), value));
  return mx::astype(mx::where(nan, wide, value), x.dtype());
}

mx::array softmax(const mx::array& x, int axis) {
  if (x.size() == 0) {  // no maximum to take: MLX's own
    return mx::softmax(x, std::vector<int>{axis}, /*precise=*/true);
  }
  const auto wide = mx::astype(x, mx::float32);
  const auto e = exp_of_nonpositive(mx::subtract(wide, mx::max(wide, axis, /*keepdims=*/true)));
  return mx::astype(mx::divide(e, mx::sum(e, axis, /*keepdims=*/true)), x.dtype());
}

mx::array attention(mx::array q, mx::array k, mx::array v, float scale, const std::string& mask_mode,
                    std::optional<mx::array> mask) {
  auto mlx_own = mx::fast::scaled_dot_product_attention(q, k, v, scale, mask_mode, mask);  // its checks
  if (!float32_or_narrower(q) || k.dtype() != q.dtype() || v.dtype() != q.dtype() || k.shape(2) == 0) {
    return mlx_own;
  }
  const int batch = q.shape(0), heads = q.shape(1), queries = q.shape(2), kv_heads = k.shape(1), keys = k.shape(2);
  const int groups = heads / kv_heads;
  q = mx::multiply(q, mx::array(scale, q.dtype()));
  if (groups > 1) {
    q = mx::unflatten(q, 1, {kv_heads, groups});
    k = mx::expand_dims(k, 2);
    v = mx::expand_dims(v, 2);
  }
  auto scores = mx::matmul(q, mx::swapaxes(k, -1, -2));
  if (mask_mode == "causal") {  // aligned to the last key, as MLX's
    mask = mx::greater_equal(mx::expand_dims(mx::arange(keys - queries, keys), 1),
                             mx::expand_dims(mx::arange(0, keys), 0));
  } else if (mask) {
    auto full = mx::broadcast_to(mask->dtype() == mx::bool_ ? *mask : mx::astype(*mask, q.dtype()),
                                 {batch, heads, queries, keys});
    mask = groups > 1 ? mx::unflatten(full, 1, {kv_heads, groups}) : full;
  }
  if (mask) {
    scores = mask->dtype() == mx::bool_
                 ? mx::where(*mask, scores, mx::array(mx::finfo(scores.dtype()).min, scores.dtype()))
                 : mx::add(scores, *mask);
  }
  const auto out = mx::matmul(cpu_math::softmax(scores, -1), v);
  return groups > 1 ? mx::flatten(out, 1, 2) : out;
}

std::optional<mx::array> unary(etmlx_ir::UnaryOp op, const mx::array& x) {
  if (!float32_or_narrower(x)) {
    return std::nullopt;
  }
  switch (op) {
    case etmlx_ir::UnaryOp::Erf:
      return rational_erf(x);
    case etmlx_ir::UnaryOp::GeluErf:
      return gelu(x);
    case etmlx_ir::UnaryOp::Exp:
      return exp_by_parts(x);
    case etmlx_ir::UnaryOp::Sigmoid:
      return sigmoid_by_parts(x);
    case etmlx_ir::UnaryOp::Silu:
      return silu(x);
    default:
      return std::nullopt;
  }
}

namespace {

mx::array lower_triangle(int n, int diagonal) { return mx::tril(mx::ones({n, n}, mx::bool_), diagonal); }

mx::array transposed(const mx::array& x) { return mx::swapaxes(x, -1, -2); }

// One chunk of n tokens from `memory` (B, H, Dk, Dv): {its output, the memory after it}.
// The delta rule's updates within the chunk are resolved at once: the inverse of a unit
// lower-triangular matrix (the WY form of FLA's and transformers' chunked kernels).
std::pair<mx::array, mx::array> gated_delta_chunk(const mx::array& q, const mx::array& k, const mx::array& v,
                                                  const mx::array& log_decay, const mx::array& beta,
                                                  const mx::array& memory) {
  const int n = q.shape(2);
  const auto total = mx::cumsum(log_decay, -1);  // the decay since the chunk began
  const auto causal = lower_triangle(n, 0);
  const auto zero = scalar(0.0);
  const auto gaps = mx::subtract(mx::expand_dims(total, -1), mx::expand_dims(total, -2));
  const auto between = mx::where(causal, mx::exp(mx::where(causal, gaps, zero)), zero);
  const auto weighted = mx::multiply(k, mx::expand_dims(beta, -1));
  const auto interaction =
      mx::where(lower_triangle(n, -1), mx::multiply(mx::matmul(weighted, transposed(k)), between), zero);
  const auto resolve = mx::linalg::tri_inv(mx::add(interaction, mx::eye(n, mx::float32)), /*upper=*/false, mx::Device::cpu);
  const auto decayed = mx::expand_dims(mx::exp(total), -1);
  const auto updates = mx::subtract(mx::matmul(resolve, mx::multiply(v, mx::expand_dims(beta, -1))),
                                    mx::matmul(mx::matmul(resolve, mx::multiply(weighted, decayed)), memory));
  const auto scores = mx::where(causal, mx::multiply(mx::matmul(q, transposed(k)), between), zero);
  auto output = mx::add(mx::matmul(mx::multiply(q, decayed), memory), mx::matmul(scores, updates));
  const auto last = mx::slice(total, {0, 0, n - 1}, total.shape());
  auto next = mx::add(
      mx::multiply(memory, mx::expand_dims(mx::exp(last), -1)),
      mx::matmul(transposed(mx::multiply(k, mx::expand_dims(mx::exp(mx::subtract(last, total)), -1))), updates));
  return {std::move(output), std::move(next)};
}

}  // namespace

std::vector<mx::array> gated_delta_chunks(mx::array q, mx::array k, const mx::array& v, const mx::array& gamma,
                                          const mx::array& beta, const mx::array& state) {
  const int repeat = v.shape(2) / q.shape(2);
  if (repeat > 1) {
    q = mx::repeat(q, repeat, 2);
    k = mx::repeat(k, repeat, 2);
  }
  q = mx::swapaxes(q, 1, 2);  // (B, H, T, D)
  k = mx::swapaxes(k, 1, 2);
  const auto values = mx::swapaxes(v, 1, 2);
  const auto log_decay =
      mx::maximum(mx::log(mx::swapaxes(gamma, 1, 2)), scalar(kGatedDeltaLeastLog));
  const auto rates = mx::swapaxes(beta, 1, 2);
  auto memory = transposed(state);  // (B, H, Dk, Dv)
  std::vector<mx::array> outputs;
  const int steps = q.shape(2);
  for (int start = 0; start < steps; start += kGatedDeltaChunk) {
    const int stop = std::min(start + kGatedDeltaChunk, steps);
    const auto rows = [&](const mx::array& x) {
      auto from = mx::Shape(x.ndim(), 0);
      auto to = x.shape();
      from[2] = start;
      to[2] = stop;
      return mx::slice(x, from, to);
    };
    auto [output, next] =
        gated_delta_chunk(rows(q), rows(k), rows(values), rows(log_decay), rows(rates), memory);
    outputs.push_back(std::move(output));
    memory = std::move(next);
  }
  const auto output = outputs.size() == 1 ? outputs[0] : mx::concatenate(outputs, 2);
  return {mx::swapaxes(output, 1, 2), transposed(memory)};
}

}  // namespace etmlx::native::cpu_math
