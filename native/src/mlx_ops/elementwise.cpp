// Unary, Binary, Where, AsType, Scalar.
#include <cmath>
#include <utility>

#include <mlx/ops.h>

#include "../dtypes.h"
#include "cpu_math.h"
#include "mlx_functions.h"
#include "registry.h"
#include "scalars.h"

namespace etmlx::native {

namespace {

using mlx_functions::kBinaryOp;
using mlx_functions::kUnaryOp;
static_assert(covers_enum(kUnaryOp), "every UnaryOp needs a function, in enum order");
static_assert(covers_enum(kBinaryOp), "every BinaryOp needs a function, in enum order");

// MLX's function for the op, or on MLX's CPU the faster form of cpu_math.
mx::array unary(const etmlx_ir::Unary& op, Env& env) {
  const auto& x = env.t(op.x());
  if (mx::default_device() == mx::Device::cpu) {
    if (auto fast = cpu_math::unary(op.op(), x)) {
      return *std::move(fast);
    }
  }
  return kUnaryOp[static_cast<size_t>(op.op())].second(x);
}

mx::array binary(const etmlx_ir::Binary& op, Env& env) {
  return kBinaryOp[static_cast<size_t>(op.op())].second(env.t(op.a()), env.t(op.b()));
}

mx::array where(const etmlx_ir::Where& op, Env& env) {
  return mx::where(env.t(op.cond()), env.t(op.a()), env.t(op.b()));
}

// `x` cast to an integer dtype, defined for every value and as PyTorch casts on
// x86: through int32 for int32 and narrower dtypes, else int64, where NaN and values out of range
// give the minimum ("integer indefinite"); narrower dtypes then wrap. A plain
// cast of those values is undefined behaviour in the C++ that mx::compile
// generates, and indices computed this way must stay clampable.
mx::array float_to_integer(const mx::array& x, mx::Dtype dtype) {
  const auto through = dtype == mx::int32 || dtype.size() < 4 ? mx::int32 : mx::int64;
  const float end = std::ldexp(1.0f, through == mx::int32 ? 31 : 63);  // a power of two: exact
  const auto wide = mx::astype(x, mx::float32);                         // exact for float16 and bfloat16
  const auto indefinite = mx::logical_or(
      mx::logical_or(mx::less(wide, mx::array(-end)), mx::greater_equal(wide, mx::array(end))), mx::isnan(wide));
  const auto inside = mx::astype(mx::where(indefinite, mx::array(0.0f), wide), through);
  const auto cast = mx::where(indefinite, mx::astype(mx::array(-end), through), inside);
  return dtype == through ? cast : mx::astype(cast, dtype);
}

mx::array as_type(const etmlx_ir::AsType& op, Env& env) {
  const auto& x = env.t(op.x());
  const auto dtype = mlx_dtype(op.dtype());
  if (mx::issubdtype(x.dtype(), mx::floating) && mx::issubdtype(dtype, mx::integer)) {
    return float_to_integer(x, dtype);
  }
  return mx::astype(x, dtype);
}

mx::array scalar(const etmlx_ir::Scalar& op, Env&) {
  return fill_value(op.value(), op.int_value(), mlx_dtype(op.dtype()));
}

}  // namespace

void register_elementwise(Registry& r) {
  r.tensor<etmlx_ir::Unary, unary>();
  r.tensor<etmlx_ir::Binary, binary>();
  r.tensor<etmlx_ir::Where, where>();
  r.tensor<etmlx_ir::AsType, as_type>();
  r.tensor<etmlx_ir::Scalar, scalar>();
  r.operations("Unary", enum_names(kUnaryOp, etmlx_ir::EnumNameUnaryOp));
  r.operations("Binary", enum_names(kBinaryOp, etmlx_ir::EnumNameBinaryOp));
}

}  // namespace etmlx::native
