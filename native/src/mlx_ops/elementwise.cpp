// Unary, Binary, Where, AsType, Scalar.
#include <array>
#include <cmath>
#include <numbers>
#include <utility>

#include <mlx/ops.h>

#include "../dtypes.h"
#include "registry.h"
#include "scalars.h"

namespace etmlx::native {

namespace {

using etmlx_ir::BinaryOp;
using etmlx_ir::UnaryOp;
using UnaryFn = mx::array (*)(const mx::array&);
using BinaryFn = mx::array (*)(const mx::array&, const mx::array&);

// mlx.nn's activations, written as mlx.nn writes them (same operations, same
// order), so both runtimes agree to the bit.
mx::array relu(const mx::array& x) { return mx::maximum(x, mx::array(0, x.dtype())); }

mx::array silu(const mx::array& x) { return mx::multiply(x, mx::sigmoid(x)); }

mx::array gelu(const mx::array& x) {
  const auto dtype = x.dtype();
  const auto cdf = mx::add(mx::array(1, dtype), mx::erf(mx::divide(x, float_scalar(std::sqrt(2.0), dtype))));
  return mx::divide(mx::multiply(x, cdf), mx::array(2, dtype));
}

mx::array gelu_tanh(const mx::array& x) {
  const auto dtype = x.dtype();
  const auto cube = mx::multiply(float_scalar(0.044715, dtype), mx::power(x, mx::array(3, dtype)));
  const auto inner = mx::multiply(float_scalar(std::sqrt(2.0 / std::numbers::pi), dtype), mx::add(x, cube));
  const auto half_x = mx::multiply(float_scalar(0.5, dtype), x);
  return mx::multiply(half_x, mx::add(mx::array(1, dtype), mx::tanh(inner)));
}

constexpr std::array<std::pair<UnaryOp, UnaryFn>, 37> kUnary = {{
    {UnaryOp::Neg, [](const mx::array& x) { return mx::negative(x); }},
    {UnaryOp::Abs, [](const mx::array& x) { return mx::abs(x); }},
    {UnaryOp::Exp, [](const mx::array& x) { return mx::exp(x); }},
    {UnaryOp::Log, [](const mx::array& x) { return mx::log(x); }},
    {UnaryOp::Sqrt, [](const mx::array& x) { return mx::sqrt(x); }},
    {UnaryOp::Rsqrt, [](const mx::array& x) { return mx::rsqrt(x); }},
    {UnaryOp::Reciprocal, [](const mx::array& x) { return mx::reciprocal(x); }},
    {UnaryOp::Sin, [](const mx::array& x) { return mx::sin(x); }},
    {UnaryOp::Cos, [](const mx::array& x) { return mx::cos(x); }},
    {UnaryOp::Tanh, [](const mx::array& x) { return mx::tanh(x); }},
    {UnaryOp::Sigmoid, [](const mx::array& x) { return mx::sigmoid(x); }},
    {UnaryOp::Erf, [](const mx::array& x) { return mx::erf(x); }},
    {UnaryOp::Floor, [](const mx::array& x) { return mx::floor(x); }},
    {UnaryOp::Ceil, [](const mx::array& x) { return mx::ceil(x); }},
    {UnaryOp::Relu, relu},
    {UnaryOp::Silu, silu},
    {UnaryOp::GeluErf, gelu},
    {UnaryOp::GeluTanh, gelu_tanh},
    {UnaryOp::LogicalNot, [](const mx::array& x) { return mx::logical_not(x); }},
    {UnaryOp::Sign, [](const mx::array& x) { return mx::sign(x); }},
    {UnaryOp::Log1p, [](const mx::array& x) { return mx::log1p(x); }},
    {UnaryOp::Expm1, [](const mx::array& x) { return mx::expm1(x); }},
    {UnaryOp::Tan, [](const mx::array& x) { return mx::tan(x); }},
    {UnaryOp::Atan, [](const mx::array& x) { return mx::arctan(x); }},
    {UnaryOp::Asin, [](const mx::array& x) { return mx::arcsin(x); }},
    {UnaryOp::Acos, [](const mx::array& x) { return mx::arccos(x); }},
    {UnaryOp::Sinh, [](const mx::array& x) { return mx::sinh(x); }},
    {UnaryOp::Cosh, [](const mx::array& x) { return mx::cosh(x); }},
    {UnaryOp::IsNan, [](const mx::array& x) { return mx::isnan(x); }},
    {UnaryOp::IsInf, [](const mx::array& x) { return mx::isinf(x); }},
    {UnaryOp::Log2, [](const mx::array& x) { return mx::log2(x); }},
    {UnaryOp::Log10, [](const mx::array& x) { return mx::log10(x); }},
    {UnaryOp::Round, [](const mx::array& x) { return mx::round(x); }},
    {UnaryOp::Asinh, [](const mx::array& x) { return mx::arcsinh(x); }},
    {UnaryOp::Acosh, [](const mx::array& x) { return mx::arccosh(x); }},
    {UnaryOp::Atanh, [](const mx::array& x) { return mx::arctanh(x); }},
    {UnaryOp::BitwiseNot, [](const mx::array& x) { return mx::bitwise_invert(x); }},
}};
static_assert(covers_enum(kUnary), "every UnaryOp needs a handler, in enum order");

constexpr std::array<std::pair<BinaryOp, BinaryFn>, 21> kBinary = {{
    {BinaryOp::Add, [](const mx::array& a, const mx::array& b) { return mx::add(a, b); }},
    {BinaryOp::Sub, [](const mx::array& a, const mx::array& b) { return mx::subtract(a, b); }},
    {BinaryOp::Mul, [](const mx::array& a, const mx::array& b) { return mx::multiply(a, b); }},
    {BinaryOp::Div, [](const mx::array& a, const mx::array& b) { return mx::divide(a, b); }},
    {BinaryOp::Maximum, [](const mx::array& a, const mx::array& b) { return mx::maximum(a, b); }},
    {BinaryOp::Minimum, [](const mx::array& a, const mx::array& b) { return mx::minimum(a, b); }},
    {BinaryOp::Power, [](const mx::array& a, const mx::array& b) { return mx::power(a, b); }},
    {BinaryOp::Equal, [](const mx::array& a, const mx::array& b) { return mx::equal(a, b); }},
    {BinaryOp::NotEqual, [](const mx::array& a, const mx::array& b) { return mx::not_equal(a, b); }},
    {BinaryOp::Less, [](const mx::array& a, const mx::array& b) { return mx::less(a, b); }},
    {BinaryOp::LessEqual, [](const mx::array& a, const mx::array& b) { return mx::less_equal(a, b); }},
    {BinaryOp::Greater, [](const mx::array& a, const mx::array& b) { return mx::greater(a, b); }},
    {BinaryOp::GreaterEqual, [](const mx::array& a, const mx::array& b) { return mx::greater_equal(a, b); }},
    {BinaryOp::LogicalAnd, [](const mx::array& a, const mx::array& b) { return mx::logical_and(a, b); }},
    {BinaryOp::LogicalOr, [](const mx::array& a, const mx::array& b) { return mx::logical_or(a, b); }},
    {BinaryOp::FloorDivide, [](const mx::array& a, const mx::array& b) { return mx::floor_divide(a, b); }},
    {BinaryOp::Remainder, [](const mx::array& a, const mx::array& b) { return mx::remainder(a, b); }},
    {BinaryOp::BitwiseAnd, [](const mx::array& a, const mx::array& b) { return mx::bitwise_and(a, b); }},
    {BinaryOp::BitwiseOr, [](const mx::array& a, const mx::array& b) { return mx::bitwise_or(a, b); }},
    {BinaryOp::BitwiseXor, [](const mx::array& a, const mx::array& b) { return mx::bitwise_xor(a, b); }},
    {BinaryOp::Atan2, [](const mx::array& a, const mx::array& b) { return mx::arctan2(a, b); }},
}};
static_assert(covers_enum(kBinary), "every BinaryOp needs a handler, in enum order");

mx::array unary(const etmlx_ir::Unary& op, Env& env) {
  return kUnary[static_cast<size_t>(op.op())].second(env.t(op.x()));
}

mx::array binary(const etmlx_ir::Binary& op, Env& env) {
  return kBinary[static_cast<size_t>(op.op())].second(env.t(op.a()), env.t(op.b()));
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
  r.operations("Unary", enum_names(kUnary, etmlx_ir::EnumNameUnaryOp));
  r.operations("Binary", enum_names(kBinary, etmlx_ir::EnumNameBinaryOp));
}

}  // namespace etmlx::native
