// Generated from serializer/schema.fbs by serializer/regenerate.py. Do not edit.
// The MLX function each op enum value runs (schema.fbs's `mlx` attributes).
#pragma once

#include <array>
#include <utility>
#include <vector>

#include <mlx/ops.h>

#include "etmlx_ir_generated.h"
#include "mlx_ops/mlx_nn.h"

namespace etmlx::native::mlx_functions {

namespace mx = mlx::core;

inline constexpr std::array<std::pair<etmlx_ir::UnaryOp, mx::array (*)(const mx::array&)>, 37> kUnaryOp = {{
    {etmlx_ir::UnaryOp::Neg, [](const mx::array& a0) { return mx::negative(a0); }},
    {etmlx_ir::UnaryOp::Abs, [](const mx::array& a0) { return mx::abs(a0); }},
    {etmlx_ir::UnaryOp::Exp, [](const mx::array& a0) { return mx::exp(a0); }},
    {etmlx_ir::UnaryOp::Log, [](const mx::array& a0) { return mx::log(a0); }},
    {etmlx_ir::UnaryOp::Sqrt, [](const mx::array& a0) { return mx::sqrt(a0); }},
    {etmlx_ir::UnaryOp::Rsqrt, [](const mx::array& a0) { return mx::rsqrt(a0); }},
    {etmlx_ir::UnaryOp::Reciprocal, [](const mx::array& a0) { return mx::reciprocal(a0); }},
    {etmlx_ir::UnaryOp::Sin, [](const mx::array& a0) { return mx::sin(a0); }},
    {etmlx_ir::UnaryOp::Cos, [](const mx::array& a0) { return mx::cos(a0); }},
    {etmlx_ir::UnaryOp::Tanh, [](const mx::array& a0) { return mx::tanh(a0); }},
    {etmlx_ir::UnaryOp::Sigmoid, [](const mx::array& a0) { return mx::sigmoid(a0); }},
    {etmlx_ir::UnaryOp::Erf, [](const mx::array& a0) { return mx::erf(a0); }},
    {etmlx_ir::UnaryOp::Floor, [](const mx::array& a0) { return mx::floor(a0); }},
    {etmlx_ir::UnaryOp::Ceil, [](const mx::array& a0) { return mx::ceil(a0); }},
    {etmlx_ir::UnaryOp::Relu, [](const mx::array& a0) { return nn::relu(a0); }},
    {etmlx_ir::UnaryOp::Silu, [](const mx::array& a0) { return nn::silu(a0); }},
    {etmlx_ir::UnaryOp::GeluErf, [](const mx::array& a0) { return nn::gelu(a0); }},
    {etmlx_ir::UnaryOp::GeluTanh, [](const mx::array& a0) { return nn::gelu_approx(a0); }},
    {etmlx_ir::UnaryOp::LogicalNot, [](const mx::array& a0) { return mx::logical_not(a0); }},
    {etmlx_ir::UnaryOp::Sign, [](const mx::array& a0) { return mx::sign(a0); }},
    {etmlx_ir::UnaryOp::Log1p, [](const mx::array& a0) { return mx::log1p(a0); }},
    {etmlx_ir::UnaryOp::Expm1, [](const mx::array& a0) { return mx::expm1(a0); }},
    {etmlx_ir::UnaryOp::Tan, [](const mx::array& a0) { return mx::tan(a0); }},
    {etmlx_ir::UnaryOp::Atan, [](const mx::array& a0) { return mx::arctan(a0); }},
    {etmlx_ir::UnaryOp::Asin, [](const mx::array& a0) { return mx::arcsin(a0); }},
    {etmlx_ir::UnaryOp::Acos, [](const mx::array& a0) { return mx::arccos(a0); }},
    {etmlx_ir::UnaryOp::Sinh, [](const mx::array& a0) { return mx::sinh(a0); }},
    {etmlx_ir::UnaryOp::Cosh, [](const mx::array& a0) { return mx::cosh(a0); }},
    {etmlx_ir::UnaryOp::IsNan, [](const mx::array& a0) { return mx::isnan(a0); }},
    {etmlx_ir::UnaryOp::IsInf, [](const mx::array& a0) { return mx::isinf(a0); }},
    {etmlx_ir::UnaryOp::Log2, [](const mx::array& a0) { return mx::log2(a0); }},
    {etmlx_ir::UnaryOp::Log10, [](const mx::array& a0) { return mx::log10(a0); }},
    {etmlx_ir::UnaryOp::Round, [](const mx::array& a0) { return mx::round(a0); }},
    {etmlx_ir::UnaryOp::Asinh, [](const mx::array& a0) { return mx::arcsinh(a0); }},
    {etmlx_ir::UnaryOp::Acosh, [](const mx::array& a0) { return mx::arccosh(a0); }},
    {etmlx_ir::UnaryOp::Atanh, [](const mx::array& a0) { return mx::arctanh(a0); }},
    {etmlx_ir::UnaryOp::BitwiseNot, [](const mx::array& a0) { return mx::bitwise_invert(a0); }},
}};

inline constexpr std::array<std::pair<etmlx_ir::BinaryOp, mx::array (*)(const mx::array&, const mx::array&)>, 21> kBinaryOp = {{
    {etmlx_ir::BinaryOp::Add, [](const mx::array& a0, const mx::array& a1) { return mx::add(a0, a1); }},
    {etmlx_ir::BinaryOp::Sub, [](const mx::array& a0, const mx::array& a1) { return mx::subtract(a0, a1); }},
    {etmlx_ir::BinaryOp::Mul, [](const mx::array& a0, const mx::array& a1) { return mx::multiply(a0, a1); }},
    {etmlx_ir::BinaryOp::Div, [](const mx::array& a0, const mx::array& a1) { return mx::divide(a0, a1); }},
    {etmlx_ir::BinaryOp::Maximum, [](const mx::array& a0, const mx::array& a1) { return mx::maximum(a0, a1); }},
    {etmlx_ir::BinaryOp::Minimum, [](const mx::array& a0, const mx::array& a1) { return mx::minimum(a0, a1); }},
    {etmlx_ir::BinaryOp::Power, [](const mx::array& a0, const mx::array& a1) { return mx::power(a0, a1); }},
    {etmlx_ir::BinaryOp::Equal, [](const mx::array& a0, const mx::array& a1) { return mx::equal(a0, a1); }},
    {etmlx_ir::BinaryOp::NotEqual, [](const mx::array& a0, const mx::array& a1) { return mx::not_equal(a0, a1); }},
    {etmlx_ir::BinaryOp::Less, [](const mx::array& a0, const mx::array& a1) { return mx::less(a0, a1); }},
    {etmlx_ir::BinaryOp::LessEqual, [](const mx::array& a0, const mx::array& a1) { return mx::less_equal(a0, a1); }},
    {etmlx_ir::BinaryOp::Greater, [](const mx::array& a0, const mx::array& a1) { return mx::greater(a0, a1); }},
    {etmlx_ir::BinaryOp::GreaterEqual, [](const mx::array& a0, const mx::array& a1) { return mx::greater_equal(a0, a1); }},
    {etmlx_ir::BinaryOp::LogicalAnd, [](const mx::array& a0, const mx::array& a1) { return mx::logical_and(a0, a1); }},
    {etmlx_ir::BinaryOp::LogicalOr, [](const mx::array& a0, const mx::array& a1) { return mx::logical_or(a0, a1); }},
    {etmlx_ir::BinaryOp::FloorDivide, [](const mx::array& a0, const mx::array& a1) { return mx::floor_divide(a0, a1); }},
    {etmlx_ir::BinaryOp::Remainder, [](const mx::array& a0, const mx::array& a1) { return mx::remainder(a0, a1); }},
    {etmlx_ir::BinaryOp::BitwiseAnd, [](const mx::array& a0, const mx::array& a1) { return mx::bitwise_and(a0, a1); }},
    {etmlx_ir::BinaryOp::BitwiseOr, [](const mx::array& a0, const mx::array& a1) { return mx::bitwise_or(a0, a1); }},
    {etmlx_ir::BinaryOp::BitwiseXor, [](const mx::array& a0, const mx::array& a1) { return mx::bitwise_xor(a0, a1); }},
    {etmlx_ir::BinaryOp::Atan2, [](const mx::array& a0, const mx::array& a1) { return mx::arctan2(a0, a1); }},
}};

inline constexpr std::array<std::pair<etmlx_ir::ReduceOp, mx::array (*)(const mx::array&, const std::vector<int>&, bool)>, 7> kReduceOp = {{
    {etmlx_ir::ReduceOp::Sum, [](const mx::array& a0, const std::vector<int>& a1, bool a2) { return mx::sum(a0, a1, a2); }},
    {etmlx_ir::ReduceOp::Mean, [](const mx::array& a0, const std::vector<int>& a1, bool a2) { return mx::mean(a0, a1, a2); }},
    {etmlx_ir::ReduceOp::Max, [](const mx::array& a0, const std::vector<int>& a1, bool a2) { return mx::max(a0, a1, a2); }},
    {etmlx_ir::ReduceOp::Min, [](const mx::array& a0, const std::vector<int>& a1, bool a2) { return mx::min(a0, a1, a2); }},
    {etmlx_ir::ReduceOp::Prod, [](const mx::array& a0, const std::vector<int>& a1, bool a2) { return mx::prod(a0, a1, a2); }},
    {etmlx_ir::ReduceOp::Any, [](const mx::array& a0, const std::vector<int>& a1, bool a2) { return mx::any(a0, a1, a2); }},
    {etmlx_ir::ReduceOp::All, [](const mx::array& a0, const std::vector<int>& a1, bool a2) { return mx::all(a0, a1, a2); }},
}};

inline constexpr std::array<std::pair<etmlx_ir::ArgReduceOp, mx::array (*)(const mx::array&, int, bool)>, 2> kArgReduceOp = {{
    {etmlx_ir::ArgReduceOp::ArgMax, [](const mx::array& a0, int a1, bool a2) { return mx::argmax(a0, a1, a2); }},
    {etmlx_ir::ArgReduceOp::ArgMin, [](const mx::array& a0, int a1, bool a2) { return mx::argmin(a0, a1, a2); }},
}};

inline constexpr std::array<std::pair<etmlx_ir::ScanOp, mx::array (*)(const mx::array&, int)>, 1> kScanOp = {{
    {etmlx_ir::ScanOp::CumSum, [](const mx::array& a0, int a1) { return mx::cumsum(a0, a1); }},
}};

}  // namespace etmlx::native::mlx_functions
