#include "mlx_nn.h"

#include <cmath>
#include <numbers>

#include <mlx/ops.h>

#include "scalars.h"

namespace etmlx::native::nn {

mx::array relu(const mx::array& x) { return mx::maximum(x, mx::array(0, x.dtype())); }

mx::array silu(const mx::array& x) { return mx::multiply(x, mx::sigmoid(x)); }

mx::array gelu(const mx::array& x) {
  const auto dtype = x.dtype();
  const auto cdf = mx::add(mx::array(1, dtype), mx::erf(mx::divide(x, float_scalar(std::sqrt(2.0), dtype))));
  return mx::divide(mx::multiply(x, cdf), mx::array(2, dtype));
}

mx::array gelu_approx(const mx::array& x) {
  const auto dtype = x.dtype();
  const auto cube = mx::multiply(float_scalar(0.044715, dtype), mx::power(x, mx::array(3, dtype)));
  const auto inner = mx::multiply(float_scalar(std::sqrt(2.0 / std::numbers::pi), dtype), mx::add(x, cube));
  const auto half_x = mx::multiply(float_scalar(0.5, dtype), x);
  return mx::multiply(half_x, mx::add(mx::array(1, dtype), mx::tanh(inner)));
}

}  // namespace etmlx::native::nn
