#include "cpu_math.h"

#include <cmath>
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

std::optional<mx::array> unary(etmlx_ir::UnaryOp op, const mx::array& x) {
  if (!float32_or_narrower(x)) {
    return std::nullopt;
  }
  switch (op) {
    case etmlx_ir::UnaryOp::Erf:
      return rational_erf(x);
    case etmlx_ir::UnaryOp::GeluErf:
      return gelu(x);
    default:
      return std::nullopt;
  }
}

}  // namespace etmlx::native::cpu_math
