// SymSize, IntBinary (Python's integer arithmetic on sizes), SizeScalar.
#include <array>
#include <stdexcept>
#include <string>
#include <utility>

#include <mlx/ops.h>

#include "../dtypes.h"
#include "registry.h"

namespace etmlx::native {

namespace {

using etmlx_ir::IntBinaryOp;
using IntBinaryFn = int64_t (*)(int64_t, int64_t);

[[noreturn]] void overflow() { throw std::overflow_error("size arithmetic overflows int64"); }

void check_divisor(int64_t a, int64_t b) {
  if (b == 0) {
    throw std::domain_error("size arithmetic divides by zero");
  }
  if (a == std::numeric_limits<int64_t>::min() && b == -1) {
    overflow();
  }
}

// Python's // and %: the quotient rounds toward negative infinity and the
// remainder takes the divisor's sign, as SymInt arithmetic does.
int64_t floor_divide(int64_t a, int64_t b) {
  check_divisor(a, b);
  const int64_t quotient = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? quotient - 1 : quotient;
}

int64_t modulo(int64_t a, int64_t b) {
  check_divisor(a, b);
  const int64_t remainder = a % b;
  return (remainder != 0 && ((remainder < 0) != (b < 0))) ? remainder + b : remainder;
}

constexpr std::array<std::pair<IntBinaryOp, IntBinaryFn>, 5> kIntBinary = {{
    {IntBinaryOp::Add,
     [](int64_t a, int64_t b) {
       int64_t out;
       if (__builtin_add_overflow(a, b, &out)) overflow();
       return out;
     }},
    {IntBinaryOp::Sub,
     [](int64_t a, int64_t b) {
       int64_t out;
       if (__builtin_sub_overflow(a, b, &out)) overflow();
       return out;
     }},
    {IntBinaryOp::Mul,
     [](int64_t a, int64_t b) {
       int64_t out;
       if (__builtin_mul_overflow(a, b, &out)) overflow();
       return out;
     }},
    {IntBinaryOp::FloorDivide, floor_divide},
    {IntBinaryOp::Mod, modulo},
}};
static_assert(covers_enum(kIntBinary), "every IntBinaryOp needs a handler, in enum order");

int64_t sym_size(const etmlx_ir::SymSize& op, Env& env) {
  const auto& x = env.t(op.x());
  const int ndim = static_cast<int>(x.ndim());
  const int axis = op.axis() < 0 ? op.axis() + ndim : op.axis();
  if (axis < 0 || axis >= ndim) {
    throw std::invalid_argument("axis " + std::to_string(op.axis()) + " out of range for an array of " +
                                std::to_string(ndim) + " dimensions");
  }
  return x.shape(axis);
}

int64_t int_binary(const etmlx_ir::IntBinary& op, Env& env) {
  return kIntBinary[static_cast<size_t>(op.op())].second(env.size(op.a()), env.size(op.b()));
}

mx::array size_scalar(const etmlx_ir::SizeScalar& op, Env& env) {
  return mx::array(env.size(op.value()), mlx_dtype(op.dtype()));
}

}  // namespace

void register_sizes(Registry& r) {
  r.integer<etmlx_ir::SymSize, sym_size>();
  r.integer<etmlx_ir::IntBinary, int_binary>();
  r.tensor<etmlx_ir::SizeScalar, size_scalar>();
  r.operations("IntBinary", enum_names(kIntBinary, etmlx_ir::EnumNameIntBinaryOp));
}

}  // namespace etmlx::native
