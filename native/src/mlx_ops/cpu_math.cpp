#include "cpu_math.h"

#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <span>

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

mx::array sigmoid_by_parts(const mx::array& x) {
  const auto negated = mx::negative(mx::astype(x, mx::float32));
  return mx::astype(mx::divide(mx::array(1.0f), mx::add(mx::array(1.0f), exp_by_parts(negated))), x.dtype());
}

mx::array silu(const mx::array& x) { return mx::multiply(x, sigmoid_by_parts(x)); }  // mlx.nn.silu's operations

// mlx.nn.gelu's operations (mlx_nn.cpp), with this erf.
mx::array gelu(const mx::array& x) {
  const auto dtype = x.dtype();
  const auto cdf = mx::add(mx::array(1, dtype), rational_erf(mx::divide(x, float_scalar(std::sqrt(2.0), dtype))));
  return mx::divide(mx::multiply(x, cdf), mx::array(2, dtype));
}

bool float32_or_narrower(const mx::array& x) {  // float64 and integers keep MLX's own
  return x.dtype() == mx::float32 || x.dtype() == mx::float16 || x.dtype() == mx::bfloat16;
}

}  // namespace

mx::array rational_erf(const mx::array& x) {
  const auto limit = static_cast<float>(kErfClamp);
  const auto clamped = mx::clip(mx::astype(x, mx::float32), mx::array(-limit), mx::array(limit));
  const auto square = mx::multiply(clamped, clamped);
  const auto ratio = mx::divide(polynomial(kErfNumerator, square), polynomial(kErfDenominator, square));
  return mx::astype(mx::clip(mx::multiply(clamped, ratio), mx::array(-1.0f), mx::array(1.0f)), x.dtype());
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

}  // namespace etmlx::native::cpu_math
